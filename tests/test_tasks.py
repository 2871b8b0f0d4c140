"""The task suite on the real benchmark files in ../shared/data: counts, splits, gold scoring,
prompts, row validation, `score_file`; and the sandbox tasks through the real generator."""

from __future__ import annotations

import collections
import functools
import io
import json
import math
import random
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from helpers import opened_files

from harness.config import task_paths
from harness.errors import UserError
from harness.tasks import answers, scoring
from harness.tasks import suite as tasks

REAL = [
    "gsm8k", "math", "math500", "svamp", "multiarith", "addsub", "singleeq", "asdiv", "aqua",
    "commonsenseqa", "strategyqa", "date_understanding", "tracking_shuffled_objects",
    "last_letters", "coin_flip", "arc_challenge",
]  # fmt: skip
BBH = [
    "boolean_expressions", "causal_judgement", "date_understanding", "disambiguation_qa",
    "dyck_languages", "formal_fallacies", "geometric_shapes", "hyperbaton",
    "logical_deduction_five_objects", "logical_deduction_seven_objects",
    "logical_deduction_three_objects", "movie_recommendation", "multistep_arithmetic_two",
    "navigate", "object_counting", "penguins_in_a_table", "reasoning_about_colored_objects",
    "ruin_names", "salient_translation_error_detection", "snarks", "sports_understanding",
    "temporal_sequences", "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_three_objects",
    "web_of_lies", "word_sorting",
]  # fmt: skip
SANDBOX = [
    "sandbox_addition", "sandbox_expressions", "sandbox_last_letters", "sandbox_coin_flip",
    "sandbox_sums",
]  # fmt: skip
LOCAL = [*REAL, *(f"bbh_{t}" for t in BBH)]  # every task whose files are in ../shared/data
HUB_ONLY_TRAIN = ["math_full"]  # ../shared/data has its test split only


@pytest.fixture(autouse=True)
def _no_env_data_dir(monkeypatch):
    monkeypatch.delenv("COTGAP_DATA_DIR", raising=False)
    monkeypatch.delenv("COTGAP_TASKS_DIR", raising=False)


@functools.cache
def _items(name: str, split: str, data_dir: Path) -> tuple[tasks.Item, ...]:
    return tuple(tasks.load_items(name, split, data_dir))


# --- the YAMLs -------------------------------------------------------------------------------------


def test_every_task_yaml_loads_and_is_consistent():
    names = tasks.task_names()
    assert names == sorted([*REAL, *HUB_ONLY_TRAIN, *(f"bbh_{t}" for t in BBH), *SANDBOX])
    for name in names:
        spec = tasks.load_task(name)
        assert spec.name == name and spec.version >= 1
        assert spec.answer_type in answers.EXTRACTORS[spec.extractor].answer_types
        if spec.split is not None:  # a pool divided by ratio: the declared sizes follow it
            a, b = spec.split.ratio
            n = spec.sizes["all"]
            assert spec.sizes["train"] == math.floor(n * a / (a + b) + 0.5)
            assert spec.sizes["train"] + spec.sizes["test"] == n
        if spec.fewshot is not None and spec.fewshot.file is not None:
            assert tasks.fewshot_exemplars(spec)[1], name


def test_answer_types_of_bbh_tasks():
    kinds = {t: tasks.load_task(f"bbh_{t}").answer_type for t in BBH}
    assert kinds["boolean_expressions"] == "true_false"
    assert kinds["formal_fallacies"] == "valid_invalid"
    assert {
        kinds[t] for t in ("causal_judgement", "navigate", "sports_understanding", "web_of_lies")
    } == {"yes_no"}
    assert {kinds[t] for t in ("multistep_arithmetic_two", "object_counting")} == {"number"}
    assert {kinds[t] for t in ("dyck_languages", "word_sorting")} == {"string"}
    assert collections.Counter(kinds.values())["choice"] == 17
    # 6,511 less the 3 rows whose target names no option (movie_recommendation, ruin_names)
    assert sum(tasks.load_task(f"bbh_{t}").sizes["all"] for t in BBH) == 6511 - 3


def test_unknown_task_names_the_nearest():
    with pytest.raises(UserError, match="did you mean 'gsm8k'"):
        tasks.load_task("gsm8")


def test_bad_task_yaml_is_reported_with_file_and_key(tmp_path, monkeypatch):
    good = yaml.safe_load((task_paths.tasks_dir() / "coin_flip.yaml").read_text())
    monkeypatch.setenv("COTGAP_TASKS_DIR", str(tmp_path))
    (tmp_path / "coin_flip.yaml").write_text(yaml.safe_dump({**good, "headlin": "strict"}))
    with pytest.raises(
        UserError, match=r"coin_flip.yaml: headlin: unknown key; did you mean 'headline'"
    ):
        tasks.load_task("coin_flip")
    (tmp_path / "coin_flip.yaml").write_text(yaml.safe_dump({**good, "extractor": "number"}))
    with pytest.raises(UserError, match="cannot score answer_type 'yes_no'"):
        tasks.load_task("coin_flip")
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(good))
    with pytest.raises(UserError, match="differs from the file name"):
        tasks.load_task("other")


def test_ls_tasks_reads_only_task_files_and_needs_no_data():
    tasks._load_task_file.cache_clear()  # a task another test loaded first is read again here
    with opened_files() as opened:
        rows = tasks.list_tasks_table()
    # the task YAMLs (and the few-shot files they name), never a data file or split
    assert opened and all(p.endswith((".yaml", ".yml", ".json", ".txt")) for p in opened), opened
    assert not [p for p in opened if p.endswith((".jsonl", ".parquet", ".arrow", ".csv"))]
    by_name = {r["name"]: r for r in rows}
    assert by_name["gsm8k"]["sizes"] == {"train": 7473, "test": 1319}
    assert by_name["gsm8k"]["splits"] == "train 7473 / test 1319"
    assert by_name["sandbox_addition"]["sizes"] == {"train": 2000, "test": 200}
    assert by_name["coin_flip"]["source"] == "files only"


def test_importing_tasks_stays_light():
    code = "import sys, harness.tasks.suite; print([m for m in ('torch', 'datasets', 'math_verify', 'vllm') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- counts: raw files (read independently) and loaded splits --------------------------------------------


def _jsonl_count(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def test_raw_file_counts_match_the_data_readme(shared_data):
    d = shared_data
    assert _jsonl_count(d / "gsm8k/train.jsonl") == 7473
    assert _jsonl_count(d / "gsm8k/test.jsonl") == 1319
    assert len(json.loads((d / "svamp/SVAMP.json").read_text())) == 1000
    assert _jsonl_count(d / "aqua/dev.json") == _jsonl_count(d / "aqua/test.json") == 254
    assert len(list(ET.parse(d / "asdiv/ASDiv.xml").getroot().iter("Problem"))) == 2305
    folds = [d / f"asdiv/nfolds/asdiv-a/fold{i}.txt" for i in range(5)]
    assert len({i for f in folds for i in f.read_text().split()}) == 1218
    assert len(json.loads((d / "multiarith/MultiArith.json").read_text())) == 600
    assert len(json.loads((d / "addsub/AddSub.json").read_text())) == 395
    assert len(json.loads((d / "singleeq/questions.json").read_text())) == 508
    assert _jsonl_count(d / "commonsenseqa/train_rand_split.jsonl") == 9741
    assert _jsonl_count(d / "commonsenseqa/dev_rand_split.jsonl") == 1221
    assert len(json.loads((d / "strategyqa/train.json").read_text())) == 2061
    assert len(json.loads((d / "strategyqa/dev.json").read_text())) == 229
    assert len(json.loads((d / "strategyqa/bigbench/task.json").read_text())["examples"]) == 2290
    assert (
        len(json.loads((d / "date_understanding/bigbench/task.json").read_text())["examples"])
        == 369
    )
    assert (
        len(
            json.loads((d / "date_understanding/bbh/date_understanding.json").read_text())[
                "examples"
            ]
        )
        == 250
    )
    assert len(json.loads((d / "last_letters/last_letters.json").read_text())["examples"]) == 500
    assert len(json.loads((d / "coin_flip/coin_flip.json").read_text())["examples"]) == 500
    assert (
        len(
            json.loads((d / "tracking_shuffled_objects/bigbench/task.json").read_text())["examples"]
        )
        == 750
    )
    assert _jsonl_count(d / "arc_challenge/arc_challenge_test.jsonl") == 1172
    assert _jsonl_count(d / "arc_challenge/question-answers.jsonl") == 1172
    assert _jsonl_count(d / "math/test.jsonl") == 5000
    assert _jsonl_count(d / "math500/test.jsonl") == 500


@pytest.mark.parametrize("name", LOCAL)
def test_loaded_splits_match_declared_sizes_and_partition_the_pool(shared_data, name):
    spec = tasks.load_task(name)
    train, test = _items(name, "train", shared_data), _items(name, "test", shared_data)
    everything = _items(name, "all", shared_data)
    # math's train holds what the data dir has outside MATH-500: 4,500 here, 12,000 from the hub
    sizes = {"train": 4500, "test": 500} if name == "math" else spec.sizes
    assert len(train) == sizes["train"] and len(test) == sizes["test"]
    assert len(everything) == spec.sizes.get("all", len(train) + len(test))
    ids = [it.id for it in everything]
    assert len(set(ids)) == len(ids)
    assert {it.id for it in train} | {it.id for it in test} == set(ids)
    assert not {it.id for it in train} & {it.id for it in test}
    assert all(it.question and it.gold for it in everything)


def test_math_tests_on_math500_and_trains_on_the_problems_outside_it(shared_data):
    """PRM800K's split: test is MATH-500; train is MATH less MATH-500 (from ../shared/data, the
    4,500 other test problems; math/train.jsonl would add MATH's 7,500 when present)."""
    test, train = _items("math", "test", shared_data), _items("math", "train", shared_data)
    math500 = _items("math500", "all", shared_data)
    assert [it.question for it in test] == [it.question for it in math500]
    assert [it.gold for it in test] == [it.gold for it in math500]
    full_test = _items("math_full", "test", shared_data)
    assert len(full_test) == 5000
    inside = {" ".join(it.question.split()) for it in test}
    assert not inside & {" ".join(it.question.split()) for it in train}
    outside = [it for it in full_test if " ".join(it.question.split()) not in inside]
    assert [it.question for it in train] == [it.question for it in outside]
    assert tasks.load_task("math").sizes == {"train": 12000, "test": 500}  # from the hub
    with pytest.raises(UserError, match=r"math/train.jsonl: no such file; task math_full"):
        tasks.load_items("math_full", "train", shared_data)


def test_an_optional_file_counts_when_present(shared_data, tmp_path):
    """math/train.jsonl, when the data dir holds it, joins math's train; the declared 12,000 is
    then checked (a copy of 3 problems gives 4,503, which is refused)."""
    for rel in ("math/test.jsonl", "math500/test.jsonl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared_data / rel, tmp_path / rel)
    lines = (shared_data / "math" / "test.jsonl").read_text().splitlines()[:3]
    fake = [
        json.dumps({**json.loads(x), "problem": f"Train {i}: " + json.loads(x)["problem"]})
        for i, x in enumerate(lines)
    ]
    (tmp_path / "math" / "train.jsonl").write_text("\n".join(fake) + "\n")
    with pytest.raises(UserError, match="train has 4503 items .* expects 12000"):
        tasks.load_items("math", "train", tmp_path)
    assert len(tasks.load_items("math", "test", tmp_path)) == 500


def test_split_depends_on_questions_not_on_file_order(shared_data):
    spec = tasks.load_task("svamp")
    pool = list(_items("svamp", "all", shared_data))
    train, test = tasks._split_order(pool, spec.split)
    shuffled = pool[:]
    random.Random(7).shuffle(shuffled)
    train2, test2 = tasks._split_order(shuffled, spec.split)
    assert [it.id for it in train] == [it.id for it in train2]
    assert {it.id for it in test} == {it.id for it in test2}
    other = tasks._split_order(pool, spec.split.model_copy(update={"seed": 1}))[0]
    assert {it.id for it in other} != {it.id for it in train}


def test_item_fields_and_ids(shared_data):
    first = _items("gsm8k", "test", shared_data)[0]
    assert (first.id, first.source_index, first.gold) == ("gsm8k-test-0", 0, "18")
    assert first.question.startswith("Janet") and first.meta["rationale"].endswith("#### 18")
    assert _items("gsm8k", "train", shared_data)[0].id == "gsm8k-train-0"
    assert {it.gold for it in _items("gsm8k", "all", shared_data) if it.id == "gsm8k-test-1"}
    csqa = _items("commonsenseqa", "test", shared_data)[0]
    assert csqa.id == "1afa02df02c908a558b4036e80242fac" and csqa.gold == "A"
    assert csqa.question.endswith(
        "Answer choices: (A) bank, (B) library, (C) department store, (D) mall, (E) new york."
    )
    assert csqa.meta["choices"][0] == "bank"
    asdiv = {it.id: it for it in _items("asdiv", "all", shared_data)}
    assert asdiv["nluds-0001"].gold == "9"
    assert (
        asdiv["nluds-0001"].question
        == "Seven red apples and two green apples are in the basket. How many apples are in the basket?"
    )
    svamp = {it.id: it for it in _items("svamp", "all", shared_data)}
    assert (
        svamp["chal-1"].question.startswith("Each pack of dvds costs 76 dollars. If there")
        and svamp["chal-1"].gold == "51"
    )
    singleeq = [it.gold for it in _items("singleeq", "all", shared_data)]
    assert "1/3" in singleeq and "0.26" in singleeq
    m5 = _items("math500", "all", shared_data)[0]
    assert m5.id == "test/precalculus/807.json" and m5.gold == "\\left( 3, \\frac{\\pi}{2} \\right)"
    strat = _items("strategyqa", "all", shared_data)
    assert collections.Counter(it.gold for it in strat) == {"no": 1219, "yes": 1071}
    bbh = _items("bbh_date_understanding", "all", shared_data)[0]
    assert bbh.gold == "B" and bbh.meta["choices"][1] == "12/25/1937"


def test_bigbench_options_are_lettered_and_shuffled(shared_data):
    date = _items("date_understanding", "all", shared_data)
    # the source lists the gold first in 364 of 369 items; shown options are shuffled
    share_a = collections.Counter(it.gold for it in date)["A"] / len(date)
    assert share_a < 0.3
    item = date[0]
    assert item.question.startswith(
        "Yesterday was April 30, 2021. What is the date today in MM/DD/YYYY? Answer choices: (A) "
    )
    assert item.meta["choices"]["ABCDEF".index(item.gold)] == "05/01/2021"
    tracking = _items("tracking_shuffled_objects", "all", shared_data)[0]
    assert (
        tracking.meta["choices"] == ["orange ball", "white ball", "blue ball"]
        and tracking.gold == "C"
    )


def test_arc_gold_agrees_with_the_official_key(shared_data):
    key = {}
    for line in (shared_data / "arc_challenge/question-answers.jsonl").read_text().splitlines():
        rec = json.loads(line)
        key[rec["id"]] = (
            "ABCDE"["12345".index(rec["answerKey"])]
            if rec["answerKey"].isdigit()
            else rec["answerKey"]
        )
    items = _items("arc_challenge", "all", shared_data)
    assert len(items) == len(key) == 1172
    assert all(key[it.id] == it.gold for it in items)


def test_bbh_option_text_targets_are_mapped_or_excluded_with_a_reason(shared_data):
    """movie_recommendation and ruin_names give 3 targets as option text that the source split
    at commas: they name no single option, so the task YAML excludes them and says why."""
    for name, n in (("bbh_movie_recommendation", 249), ("bbh_ruin_names", 248)):
        items = _items(name, "all", shared_data)
        assert len(items) == n and all(it.gold in answers.LETTERS for it in items)
        excluded = tasks.excluded(name)
        assert len(excluded) == 250 - n and all(e["reason"] for e in excluded)
        assert {e["source_index"] for e in excluded}.isdisjoint(it.source_index for it in items)
    assert tasks.excluded("gsm8k") == []


def test_predictions_for_excluded_rows_are_skipped(shared_data, tmp_path):
    preds = tmp_path / "p.jsonl"
    recs = [{"id": "bbh_ruin_names-99", "completion": "So the answer is (A)."}]
    preds.write_text("".join(json.dumps(r) + "\n" for r in recs))
    summary = scoring.score_file("bbh_ruin_names", preds, data_dir=shared_data, split="all")
    assert summary["n"] == 248 and summary["n_predictions"] == 0 and summary["excluded_rows"] == 2


def test_ls_items_reports_exclusions(shared_data):
    out = subprocess.run(
        [sys.executable, "-m", "harness", "ls", "items", "bbh_ruin_names", "--data-dir", str(shared_data)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert len(out.stdout.splitlines()) == 99
    assert "2 source rows excluded" in out.stderr and "source_index 144" in out.stderr


def test_real_completions_agree_with_the_original_verdicts(shared_data):
    """Regression floor on public real model completions (benchmarks/real_completions.py):
    agreement with the original authors' per-item verdicts, per set."""
    from benchmarks import real_completions

    if not (shared_data / "real-completions").is_dir():
        pytest.skip("no real-completions in the data dir")
    result = real_completions.run(shared_data)
    # measured 2026-11-27: 100.00, 96.66, 68.23, 99.42, 99.73, 98.96 %. Plan-and-Solve's verdicts
    # come from an unstored second completion, read where the reasoning states no answer (which
    # the strict headline leaves unanswered), so its floor stays low
    floors = {"openai-grade-school-math": 0.995, "faithful-cot": 0.96, "plan-and-solve": 0.675,
              "zeroeval": 0.99, "meta-prompting": 0.99, "mmlu-pro": 0.985}  # fmt: skip
    total = agree = 0
    for name, per_task in result.items():
        n, a = sum(r["n"] for r in per_task.values()), sum(r["agree"] for r in per_task.values())
        assert a / n >= floors[name], (name, a / n)
        total, agree = total + n, agree + a
    assert total > 88_000 and agree / total >= 0.95


def test_real_completions_compare_counts_fixed_and_kept(tmp_path, capsys):
    """The benchmark's --compare: misses then and now, misses fixed, agreements kept."""
    from benchmarks import real_completions

    then = {"a": False, "b": False, "c": True, "d": True, "e": False}
    originals = {"a": True, "b": True, "c": False, "d": True, "e": False}
    now = {"a": True, "b": False, "c": False, "d": True, "e": True}
    earlier = {"s": {"t": {"verdicts": {k: (originals[k], then[k]) for k in then}}}}
    real_completions.write_verdicts(earlier, tmp_path / "v.jsonl")
    result = {"s": {"t": {"verdicts": {k: (originals[k], now[k]) for k in now}}}}
    real_completions.compare(result, tmp_path / "v.jsonl")
    # kept: of d and e (agreeing then), e changed, to the gold (now right, the authors said wrong)
    last = capsys.readouterr().out.splitlines()[-1].split()
    assert last == ["s", "2", "1", "1", "50.00%", "1", "0"]


# --- gold rationales score, shuffled ones do not ----------------------------------------------------------


def _gold_completion(name: str, item: tasks.Item) -> str:
    if name in ("gsm8k", "math", "math500", "aqua"):
        return item.meta["rationale"]  # GSM8K answers, MATH solutions, AQuA rationales
    return f"The answer is {item.gold}."


def _accuracy(name: str, items, completions, key: str = "correct") -> float:
    spec = tasks.load_task(name)
    hits = [
        scoring.score(spec, c, it.gold, choices=it.meta.get("choices"))[key]
        for c, it in zip(completions, items, strict=True)
    ]
    return sum(hits) / len(hits)


GOLD_ACCURACY: dict[str, float] = {}


@pytest.mark.parametrize("name", LOCAL)
def test_gold_completions_score(shared_data, name):
    items = _items(name, "all", shared_data)
    completions = [_gold_completion(name, it) for it in items]
    assert _accuracy(name, items, completions) >= 0.995  # the task's headline reading
    if name == "aqua":
        # About 7% of AQuA's human rationales never state the letter ("...= 4.5%", "Thus A"):
        # only the flexible reading (last letter, option text or value) scores them, so it is
        # AQuA's headline; the strict one is stored beside it.
        assert tasks.load_task("aqua").headline == "flexible"
        assert _accuracy(name, items, completions, "strict_correct") >= 0.92


@pytest.mark.parametrize("name", LOCAL)
def test_shuffled_gold_completions_score_near_chance(shared_data, name):
    items = list(_items(name, "all", shared_data))
    rng = random.Random(0)
    if name == "math":  # Math-Verify on mismatched pairs costs ~10 ms each: a seeded sample
        items = rng.sample(items, 500)
    completions = [_gold_completion(name, it) for it in items]
    rng.shuffle(completions)
    acc = _accuracy(name, items, completions, "flexible_correct")
    # chance: two random items share their gold answer
    counts = collections.Counter(it.gold for it in items)
    chance = sum((c / len(items)) ** 2 for c in counts.values())
    spread = max(0.05, 4 * math.sqrt(chance * (1 - chance) / len(items)))
    if tasks.load_task(name).answer_type in ("number", "math", "string") and chance < 0.02:
        assert acc < 0.05
    else:
        assert acc <= chance + spread, (acc, chance)


def test_math_verify_agrees_with_the_boxed_gold_on_a_sample(shared_data):
    """Independent check: Math-Verify reads each full solution and matches its last box."""
    from math_verify import parse, verify

    items = random.Random(0).sample(list(_items("math", "all", shared_data)), 300)
    agree = sum(
        verify(parse("\\boxed{" + it.gold + "}"), parse(it.meta["rationale"])) for it in items
    )
    assert agree >= 0.99 * len(items)


# --- prompts -------------------------------------------------------------------------------------------


def test_zero_shot_prompts(shared_data):
    item = _items("gsm8k", "test", shared_data)[0]
    prompt = tasks.render_prompt("gsm8k", item, "zero_shot_cot")
    assert prompt.startswith(item.question + "\n") and '"The answer is N."' in prompt
    m = _items("math", "test", shared_data)[0]
    assert tasks.render_prompt("math", m, "zero_shot_cot").endswith("within \\boxed{}.")
    braces = tasks.Item("x", 0, "What is {question} in {fewshot}?", "1", {})
    assert tasks.render_prompt("gsm8k", braces, "zero_shot_cot").startswith(
        "What is {question} in {fewshot}?\n"
    )


def test_few_shot_prompts(shared_data):
    item = _items("gsm8k", "test", shared_data)[0]
    full = tasks.render_prompt("gsm8k", item, "few_shot_cot")
    assert full.count("Q: ") == 9 and full.endswith(f"Q: {item.question}\nA:")
    assert full.startswith("Q: There are 15 trees in the grove.")
    assert tasks.render_prompt("gsm8k", item, "few_shot_cot", num_fewshot=2).count("Q: ") == 3
    with pytest.raises(UserError, match="num_fewshot 9 but only 8"):
        tasks.render_prompt("gsm8k", item, "few_shot_cot", num_fewshot=9)
    aqua = _items("aqua", "test", shared_data)[0]
    assert "The answer is A." in tasks.render_prompt("aqua", aqua, "few_shot_cot")


def test_few_shot_leaves_out_the_question_itself(shared_data):
    exemplar = "2015 is coming in 36 hours. What is the date one week from today in MM/DD/YYYY?"
    item = next(
        it for it in _items("date_understanding", "all", shared_data) if it.meta["stem"] == exemplar
    )
    prompt = tasks.render_prompt("date_understanding", item, "few_shot_cot")
    assert prompt.count("Q: ") == 6  # 5 exemplars + the question
    assert prompt.count(exemplar) == 1


def test_bbh_few_shot_reads_cot_prompts_from_the_data_dir_or_the_package(shared_data):
    item = _items("bbh_date_understanding", "test", shared_data)[0]
    prompt = tasks.render_prompt(
        "bbh_date_understanding", item, "few_shot_cot", data_dir=shared_data
    )
    assert prompt.startswith(
        "Infer the date from context.\n\nQ: Today is Christmas Eve of 1937. What is the date 10 days ago"
    )
    assert prompt.count("So the answer is (") == 3
    assert prompt.endswith(f"Q: {item.question}\nA: Let's think step by step.")
    # without a data dir: the copy the package ships, the same bytes
    assert tasks.render_prompt("bbh_date_understanding", item, "few_shot_cot") == prompt


def test_sandbox_tasks_have_no_few_shot():
    item = tasks.Item("x", 0, "What is 1+1?", "2", {})
    assert tasks.render_prompt("sandbox_addition", item, "zero_shot_cot") == "What is 1+1?"
    with pytest.raises(UserError, match="no few-shot exemplars"):
        tasks.render_prompt("sandbox_addition", item, "few_shot_cot")


# --- score() --------------------------------------------------------------------------------------------


def test_score_reads_after_think_and_never_scores_truncation():
    spec = tasks.load_task("gsm8k")
    r = scoring.score(spec, "<think>The answer is 7.</think>The answer is 18.", "18")
    assert (r["strict"], r["correct"], r["truncated"]) == ("18", True, False)
    r = scoring.score(spec, "<think>The answer is 18.</think>I give up.", "18")
    assert r["strict"] is None and r["flexible"] is None and not r["correct"]
    r = scoring.score(spec, "The answer is 18.", "18", finish_reason="length")
    assert (r["strict"], r["flexible"], r["correct"], r["truncated"]) == (None, None, False, True)
    r = scoring.score(spec, "The costs: 6 + 12\n= 18 dollars", "18")  # no statement, no sentence
    assert (r["strict"], r["flexible"], r["correct"], r["flexible_correct"]) == (
        None,
        "18",
        False,
        True,
    )
    r = scoring.score(spec, "The total is 18 dollars", "18")  # a closing sentence restates it
    assert (r["strict"], r["correct"]) == (None, False)  # no statement: no strict answer
    assert (r["flexible"], r["flexible_rule"], r["flexible_correct"]) == (
        "18",
        "closing_sentence",
        True,
    )


def test_score_extractor_override():
    r = scoring.score("gsm8k", "so $x = \\boxed{\\frac{36}{2}}$", "18", extractor="math")
    assert r["correct"] and r["extractor"] == "math"
    with pytest.raises(UserError, match="cannot score task gsm8k"):
        scoring.score("gsm8k", "The answer is yes.", "18", extractor="yes_no")
    with pytest.raises(UserError, match="unknown extractor"):
        scoring.score("gsm8k", "The answer is 18.", "18", extractor="numbers")


# --- score_file() ------------------------------------------------------------------------------------------


def _write_jsonl(path: Path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_score_file(shared_data, tmp_path):
    items = _items("gsm8k", "test", shared_data)
    preds = [{"id": it.id, "completion": it.meta["rationale"]} for it in items[:10]]
    preds += [{"id": items[10].id, "completion": "The answer is 123456789."}]
    preds += [{"id": items[11].id, "completion": "I do not know."}]
    preds += [
        {
            "id": items[12].id,
            "completion": f"The answer is {items[12].gold}.",
            "finish_reason": "length",
        }
    ]
    preds += [{"id": items[13].id, "completion": f"It is {items[13].gold}"}]  # flexible only
    path = tmp_path / "preds.jsonl"
    _write_jsonl(path, preds)
    summary = scoring.score_file("gsm8k", path, data_dir=shared_data)
    n = len(items)
    assert summary["n"] == n == 1319 and summary["n_predictions"] == 14
    assert summary["accuracy"] == summary["strict_accuracy"] == pytest.approx(10 / n)
    assert summary["flexible_accuracy"] == pytest.approx(11 / n)
    assert summary["missing"] == n - 14 and summary["truncated"] == 1
    # failures exclude missing and truncated items (counted on their own)
    assert summary["format_failure_rate"] == pytest.approx(2 / n)
    assert summary["truncation_rate"] == pytest.approx(1 / n)
    out = Path(summary["out"])
    assert out == tmp_path / "preds.scored.jsonl"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == n and rows[0]["correct"] and rows[12]["truncated"] and rows[20]["missing"]
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ['{"id": "gsm8k-test-0", "completion": "x"}', '{"id": "nope", "completion": "x"}'],
            "line 2: id 'nope' is not in the test split",
        ),
        (
            [
                '{"id": "gsm8k-test-0", "completion": "x"}',
                '{"id": "gsm8k-test-0", "completion": "y"}',
            ],
            "line 2: id 'gsm8k-test-0' appears twice",
        ),
        (['{"id": "gsm8k-test-0", "completion": "x"', ""], "line 1: not valid JSON"),
        (['{"id": "gsm8k-test-0"}'], "line 1: field 'completion'"),
    ],
)
def test_score_file_rejects_bad_predictions(shared_data, tmp_path, lines, message):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=message):
        scoring.score_file("gsm8k", path, data_dir=shared_data, out_path=tmp_path / "o.jsonl")
    assert not (tmp_path / "o.jsonl").exists()


def test_score_explain_names_rule_span_and_reason(shared_data, tmp_path):
    preds = tmp_path / "p.jsonl"
    recs = [
        {"id": "gsm8k-test-0", "completion": "Therefore, the answer (arabic numerals) is 18."},
        {"id": "gsm8k-test-1", "completion": "So the answer is: it depends."},
    ]
    preds.write_text("".join(json.dumps(r) + "\n" for r in recs))
    summary = scoring.score_file("gsm8k", preds, data_dir=shared_data)
    lines = list(scoring.explain_file(summary["out"]))
    assert lines[0].startswith("ok ") and "[answer_phrase: 18.]" in lines[0]
    assert "the last answer statement names no number" in lines[1]
    assert lines[2].endswith("no prediction")
    first = json.loads(Path(summary["out"]).read_text().splitlines()[0])
    assert first["strict_rule"] == "answer_phrase" and first["strict_span"] == "18."


def _fake_eval_cell(root: Path, key: str, records: list[dict], version: int) -> None:
    cell = root / "cells" / "eval" / key
    cell.mkdir(parents=True)
    ident = {"name": "gsm8k", "version": 1, "split": "test", "limit": None,
             "extractor": "number", "extractor_version": version}  # fmt: skip
    config = {"model": {}, "adapter": None, "task": ident, "evaluate": {"decoding": "greedy"}}
    (cell / "config.yaml").write_text(yaml.safe_dump(config))
    (cell / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    acc = sum(r["correct"] for r in records) / len(records)
    (cell / "metrics.json").write_text(json.dumps({"accuracy": acc, "extractor_version": version}))
    (cell / "manifest.json").write_text("{}")


def test_rescore_results_dir_without_an_engine(tmp_path):
    """An old cell scored by extractor v1 ("answer (arabic numerals) is" unread) is re-scored
    from its completions; the cell itself is left alone."""
    recs = [
        {"id": "a", "completion": "Therefore, the answer (arabic numerals) is 18.", "gold": "18",
         "finish_reason": "stop", "strict": None, "correct": False},
        {"id": "b", "completion": "The answer is 7.", "gold": "8", "finish_reason": "stop",
         "strict": "7", "correct": False},
        {"id": "c", "completion": "The answer is", "gold": "8", "finish_reason": "length",
         "strict": None, "correct": False},
    ]  # fmt: skip
    _fake_eval_cell(tmp_path, "0" * 20, recs, 1)
    before = (tmp_path / "cells/eval" / ("0" * 20) / "predictions.jsonl").read_bytes()
    (summary,) = scoring.rescore_results(tmp_path)
    assert summary["stored_extractor_version"] == 1
    assert summary["extractor_version"] == answers.EXTRACTORS["number"].version
    assert summary["accuracy"] == pytest.approx(1 / 3) and summary["changed_verdicts"] == 1
    rescored = [json.loads(x) for x in Path(summary["out"]).read_text().splitlines()]
    assert [r["strict_rule"] for r in rescored] == ["answer_phrase", "answer_phrase", None]
    assert rescored[2]["strict_reason"] == "truncated at max_tokens"
    assert (tmp_path / "cells/eval" / ("0" * 20) / "predictions.jsonl").read_bytes() == before
    with pytest.raises(UserError, match="no complete eval cells"):
        scoring.rescore_results(tmp_path / "empty")


def test_rescore_reads_completions_holding_a_line_separator(tmp_path):
    """Records are split at "\n" only: a completion may hold U+2028, which JSON leaves as is."""
    rec = {"id": "a", "completion": "3+15=18.\u2028The answer is 18.", "gold": "18",
           "finish_reason": "stop", "strict": None, "correct": False}  # fmt: skip
    _fake_eval_cell(tmp_path, "0" * 20, [rec], 1)
    preds = tmp_path / "cells/eval" / ("0" * 20) / "predictions.jsonl"
    preds.write_text(json.dumps(rec, ensure_ascii=False) + "\n", encoding="utf-8")
    (summary,) = scoring.rescore_results(tmp_path)
    assert summary["n"] == 1 and summary["accuracy"] == 1.0


def test_items_jsonl(shared_data, tmp_path, monkeypatch):
    buf = io.StringIO()
    assert tasks.items_jsonl("coin_flip", "test", shared_data, buf, limit=3) == 3
    first = json.loads(buf.getvalue().splitlines()[0])
    assert set(first) == {"id", "source_index", "question", "gold"} and first["id"].startswith(
        "coin_flip-"
    )
    # the data dir may also come from the environment
    monkeypatch.setenv("COTGAP_DATA_DIR", str(shared_data))
    assert tasks.items_jsonl("coin_flip", "test", out=tmp_path / "items.jsonl") == 200
    assert len((tmp_path / "items.jsonl").read_text().splitlines()) == 200


# --- bad data is reported with file, row and field -----------------------------------------------------------


def _copy(shared_data: Path, tmp_path: Path, rel: str) -> Path:
    dest = tmp_path / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(shared_data / rel, dest)
    return dest


def test_a_bad_row_names_file_line_and_field(shared_data, tmp_path):
    path = _copy(shared_data, tmp_path, "gsm8k/test.jsonl")
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[4] = json.dumps({"question": "q", "answer": "no hashes here"})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(
        UserError, match=r"gsm8k/test.jsonl line 5: field 'answer': no '#### <answer>' line"
    ):
        tasks.load_items("gsm8k", "test", tmp_path)
    lines[4] = json.dumps({"question": "q", "answer": "x\n#### twelve"})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(
        UserError, match=r"line 5: field 'answer': gold answer ' twelve' is not a valid number"
    ):
        tasks.load_items("gsm8k", "test", tmp_path)
    lines[4] = lines[4][:-3]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match="gsm8k/test.jsonl: line 5: not valid JSON"):
        tasks.load_items("gsm8k", "test", tmp_path)


def test_missing_field_duplicate_id_and_wrong_size(shared_data, tmp_path):
    path = _copy(shared_data, tmp_path, "svamp/SVAMP.json")
    rows = json.loads(path.read_text())
    del rows[2]["Answer"]
    path.write_text(json.dumps(rows))
    with pytest.raises(
        UserError,
        match=r"SVAMP.json element 3 of the array: field 'Answer' \(gold answer\) is missing",
    ):
        tasks.load_items("svamp", "test", tmp_path)
    rows = json.loads((shared_data / "svamp/SVAMP.json").read_text())
    rows[5]["ID"] = rows[4]["ID"]
    path.write_text(json.dumps(rows))
    with pytest.raises(UserError, match="id 'chal-5' appears twice"):
        tasks.load_items("svamp", "test", tmp_path)
    path.write_text(json.dumps(json.loads((shared_data / "svamp/SVAMP.json").read_text())[:-1]))
    with pytest.raises(UserError, match="all has 999 items .* expects 1000"):
        tasks.load_items("svamp", "test", tmp_path)


def test_missing_file_says_where_it_was_looked_for(tmp_path):
    with pytest.raises(UserError, match=r"gsm8k/test.jsonl: no such file; task gsm8k reads"):
        tasks.load_items("gsm8k", "test", tmp_path)
    with pytest.raises(UserError, match="unknown split 'dev'"):
        tasks.load_items("gsm8k", "dev", tmp_path)


def test_hub_loading_offline_points_to_data_dir(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"offline \(HF_HUB_OFFLINE is set\).*--data-dir"):
        tasks.load_items("gsm8k", "test")
    with pytest.raises(UserError, match="no hub source.*--data-dir"):
        tasks.load_items("coin_flip", "test")


# --- sandbox tasks: the real generator --------------------------------------------------------------------


@pytest.mark.parametrize("name", SANDBOX)
def test_sandbox_tasks_load_and_their_rationales_score(name):
    pytest.importorskip("harness.sandbox.tasks")
    spec = tasks.load_task(name)
    train, test = tasks.load_items(spec, "train"), tasks.load_items(spec, "test")
    sizes = {"sandbox_sums": (2000, 1000), "sandbox_coin_flip": (2000, 2000)}  # truth-run sizes
    assert (len(train), len(test)) == sizes.get(name, (2000, 200))
    assert not {it.question for it in train} & {it.question for it in test}
    assert tasks.render_prompt(spec, test[0], "zero_shot_cot") == test[0].question
    assert all(
        scoring.score(spec, it.meta["rationale"], it.gold)["correct"] for it in [*train, *test]
    )
    assert tasks.load_items(spec, "test", limit=5) == test[:5]


def test_sandbox_rows_are_validated(monkeypatch):
    import harness.sandbox.tasks as sandbox

    monkeypatch.setattr(
        sandbox,
        "generate_items",
        lambda g, s, n, seed: [{"id": "a", "question": "q", "answer": "x", "rationale": "r"}],
    )
    with pytest.raises(UserError, match="field 'answer': gold answer 'x' is not a valid number"):
        tasks.load_items("sandbox_addition", "test")
    monkeypatch.setattr(sandbox, "generate_items", lambda g, s, n, seed: [{"id": "a"}])
    with pytest.raises(UserError, match="field 'question' must be text"):
        tasks.load_items("sandbox_addition", "test")


def test_source_version_is_the_sandbox_generators_version():
    import harness.sandbox.tasks as sandbox

    assert tasks.load_task("sandbox_addition").source_version == sandbox.VERSION == 1
    assert tasks.load_task("gsm8k").source_version is None


def test_task_path_adds_folders_next_to_the_built_in_tasks(tmp_path, monkeypatch):
    """COTGAP_TASK_PATH: a task in an extra folder is found by name beside every built-in task,
    and shadows a built-in of the same name."""
    from harness.tasks import suite as tasks

    builtin = task_paths.task_names()
    mine = tmp_path / "mine"
    mine.mkdir()
    text = (task_paths.tasks_dir() / "gsm8k.yaml").read_text(encoding="utf-8")
    (mine / "gsm8k.yaml").write_text(text.replace("version:", "# mine\nversion:", 1))
    (mine / "my_copy.yaml").write_text(text.replace("name: gsm8k", "name: my_copy", 1))
    monkeypatch.setenv("COTGAP_TASK_PATH", str(mine))
    assert set(task_paths.task_names()) == set(builtin) | {"my_copy"}
    assert task_paths.task_file("gsm8k") == mine / "gsm8k.yaml"
    assert task_paths.task_file("my_copy") == mine / "my_copy.yaml"
    assert task_paths.task_file("svamp") == task_paths.tasks_dir() / "svamp.yaml"
    assert tasks.load_task("my_copy").name == "my_copy"
    monkeypatch.delenv("COTGAP_TASK_PATH")
    with pytest.raises(UserError, match="COTGAP_TASK_PATH adds folders"):
        tasks.load_task("my_copy")
