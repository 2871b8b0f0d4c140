"""The sandbox: synthetic tasks are deterministic, disjoint and right; the shipped zoo verifies by
sha256 and loads in transformers and vLLM with the same greedy output; a rebuild on the forced fp32
path builds, records its precision and caches.

    .venv/bin/python -m pytest tests/test_sandbox.py -q

The rebuild fixture builds the test profile into $COTGAP_TEST_ZOO_DIR when set (a persistent cache
shared between runs), else into a fresh temporary directory (a real build every session, ~1 min).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers import opened_files

from harness.errors import UserError
from harness.sandbox import tasks, zoo
from harness.sandbox.tokenizer import make_tokenizer

GENERATORS = list(tasks.GENERATORS)


# --- tasks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("gen", GENERATORS)
def test_generation_is_deterministic_per_seed_and_prefix_stable(gen):
    a = tasks.generate_items(gen, "train", 200, 3)
    assert a == tasks.generate_items(gen, "train", 200, 3)
    assert tasks.generate_items(gen, "train", 50, 3) == a[:50]
    assert [x["question"] for x in tasks.generate_items(gen, "train", 200, 4)] != [
        x["question"] for x in a
    ]
    assert len({x["question"] for x in a}) == len(a) == len({x["id"] for x in a})
    assert all(set(x) == {"id", "question", "answer", "rationale"} for x in a)


@pytest.mark.parametrize("gen", GENERATORS)
def test_train_and_test_never_share_a_question_whatever_the_seeds(gen):
    train = {
        x["question"]
        for seed in (0, zoo.EVAL_SEED, zoo.PRETRAIN_SEED)
        for x in tasks.generate_items(gen, "train", 1500, seed)
    }
    for seed in (0, zoo.EVAL_SEED):
        test = {x["question"] for x in tasks.generate_items(gen, "test", 300, seed)}
        assert len(test) == 300
        assert not train & test
        assert all(tasks.split_of(gen, q) == "test" for q in test)


def test_unknown_generator_and_split_name_the_valid_ones():
    with pytest.raises(UserError, match="addition, sums, expressions, last_letters, coin_flip"):
        tasks.generate_items("additon", "train", 1, 0)
    with pytest.raises(UserError, match="train, test"):
        tasks.generate_items("addition", "dev", 1, 0)


def _check_addition(item: dict) -> None:
    a, b = map(int, re.fullmatch(r"What is (\d+)\+(\d+)\?", item["question"]).groups())
    assert item["answer"] == str(a + b)
    steps = item["rationale"].removesuffix(f". The answer is {item['answer']}.").split(", ")
    da, db = str(a)[::-1], str(b)[::-1]
    assert len(steps) == max(len(da), len(db))
    carry = 0
    for i, step in enumerate(steps):
        x, y, c, s = re.fullmatch(r"(\d)\+(\d)(\+1)?=(\d+)", step).groups()
        assert int(x) == (int(da[i]) if i < len(da) else 0)
        assert int(y) == (int(db[i]) if i < len(db) else 0)
        assert bool(c) == bool(carry)
        assert int(s) == int(x) + int(y) + carry
        carry = int(s) // 10
    assert len(item["rationale"]) <= 120


@pytest.mark.parametrize("gen", sorted(tasks.STYLES))
def test_every_style_writes_a_sum_that_adds_up_and_keeps_the_items(gen):
    """A style rewrites the rationale only; each style's steps are read back and checked: the
    column sums with their carries, and in `long` the digits so far, whose last is the answer."""
    fine = tasks.generate_items(gen, "train", 300, 0)
    for style in tasks.styles_of(gen):
        items = tasks.generate_items(gen, "train", 300, 0, style)
        assert [{**x, "rationale": ""} for x in items] == [{**x, "rationale": ""} for x in fine]
        for item in items:
            a, b = map(int, re.fullmatch(r"What is (\d+)\+(\d+)\?", item["question"]).groups())
            body = item["rationale"].removesuffix(f". The answer is {item['answer']}.")
            width = 2 if style == "chunk" else 1
            body = body.removeprefix("By pairs: " if style == "chunk" else "Columns: ")
            steps = body.split("; " if style == "long" else ", ")
            carry, base, done = 0, 10**width, ""
            for i, step in enumerate(steps):
                x, y, c, s, so_far = re.fullmatch(
                    r"(\d+)\+(\d+)(\+1)?=(\d+)(?:, so far (\d+))?", step
                ).groups()
                assert (int(x), int(y)) == ((a // base**i) % base, (b // base**i) % base)
                assert bool(c) == bool(carry) and int(s) == int(x) + int(y) + carry
                carry = int(s) // base
                if style == "long":
                    done = (s if i == len(steps) - 1 else str(int(s) % 10)) + done
                    assert so_far == done
            assert a // base ** len(steps) == b // base ** len(steps) == carry * 0
            assert (done or None) in (None, item["answer"])
    with pytest.raises(UserError, match="fine, chunk, long"):
        tasks.generate_items(gen, "train", 1, 0, "terse")
    with pytest.raises(UserError, match="valid: fine"):
        tasks.generate_items("coin_flip", "train", 1, 0, "long")


def _safe_eval(expr: str) -> int:
    assert re.fullmatch(r"[0-9+\-*()]+", expr), expr
    return eval(expr, {"__builtins__": {}})  # digits, + - * and brackets only, checked above


def _check_expressions(item: dict) -> None:
    expr = re.fullmatch(r"What is (.+)\?", item["question"]).group(1)
    value = _safe_eval(expr)
    assert item["answer"] == str(value)
    chain = item["rationale"].removesuffix(f". The answer is {item['answer']}.").split("=")
    assert chain[0] == expr and chain[-1] == str(value) and len(chain) >= 3
    assert all(_safe_eval(part) == value for part in chain)


def _check_last_letters(item: dict) -> None:
    words = re.fullmatch(r'Last letters of "([a-z ]+)"\?', item["question"]).group(1).split()
    assert 2 <= len(words) <= 4
    assert item["answer"] == "".join(w[-1] for w in words)
    for w in words:
        assert f"{w}->{w[-1]}" in item["rationale"]


def _check_coin_flip(item: dict) -> None:
    acts = re.findall(r"(\w+) (flips it|does not flip it)\.", item["question"])
    assert 2 <= len(acts) <= 4
    flips = sum(act == "flips it" for _, act in acts)
    assert item["answer"] == ("yes" if flips % 2 == 0 else "no")


@pytest.mark.parametrize("gen", GENERATORS)
def test_rationales_compute_the_answer(gen):
    check = {
        "addition": _check_addition,
        "sums": _check_addition,
        "expressions": _check_expressions,
        "last_letters": _check_last_letters,
        "coin_flip": _check_coin_flip,
    }[gen]
    items = tasks.generate_items(gen, "train", 500, 0) + tasks.generate_items(gen, "test", 200, 0)
    for item in items:
        assert item["rationale"].endswith(f"The answer is {item['answer']}.")
        check(item)
    if gen in ("addition", "sums", "expressions"):
        assert any(len(item["answer"]) >= 3 for item in items)
    if gen == "expressions":
        assert any(item["answer"].startswith("-") for item in items)


def test_tokenizer_round_trips_every_text_and_matches_the_chat_template():
    tok = make_tokenizer()
    for gen in GENERATORS:
        for item in tasks.generate_items(gen, "train", 300, 0) + tasks.generate_items(
            gen, "test", 100, 0
        ):
            for text in (item["question"], item["rationale"]):
                ids = tok(text)["input_ids"]
                assert len(ids) == len(text) and tok.unk_token_id not in ids
                assert tok.decode(ids) == text
        messages = [
            {"role": "user", "content": item["question"]},
            {"role": "assistant", "content": item["rationale"]},
        ]
        ids, start = zoo.encode_example(item["question"], item["rationale"])
        assert ids == tok.apply_chat_template(messages, tokenize=True)["input_ids"]
        prompt = tok.apply_chat_template(messages[:1], tokenize=True, add_generation_prompt=True)[
            "input_ids"
        ]
        assert ids[:start] == prompt


# --- zoo ------------------------------------------------------------------------------------------


def test_unknown_model_names_the_valid_ones():
    with pytest.raises(UserError, match="teacher-l"):
        zoo.model_dir("teacher-xxl")
    with pytest.raises(UserError, match="demo, test"):
        zoo.build(profile="paper")


def test_zoo_paths_follow_the_recipe_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("COTGAP_ZOO_DIR", str(tmp_path))
    h = zoo.recipe_hash("teacher-l")
    assert re.fullmatch(r"[0-9a-f]{12}", h)
    assert zoo.model_dir("teacher-l", root=tmp_path) == tmp_path / f"teacher-l-{h}"
    assert len({zoo.recipe_hash(n) for n in zoo.ZOO}) == len(zoo.ZOO)
    # an unfinished build (its temporary directory) is not a model
    (tmp_path / f".tmp-teacher-l-{h}-1").mkdir()
    assert not zoo.is_built("teacher-l", root=tmp_path)


def test_every_recipe_is_shipped_and_verifies_reading_only_its_files():
    for name in zoo.ZOO:
        assert zoo.shipped(name) == zoo.SHIPPED / name, f"{name}: rebuild and --ship the zoo"
        zoo.verify_shipped.cache_clear()
        with opened_files() as opened_any:
            digest = zoo.verify_shipped(name)
        # a module imported on first use (run alone, this test is the first to verify) is code,
        # not a file the check reads
        opened = [p for p in opened_any if not p.endswith((".py", ".pyc", ".so"))]
        # the model's own files and the sums file, each once: no build, no other model
        assert len(opened) == len(set(opened)) <= len(list((zoo.SHIPPED / name).iterdir())) + 1
        assert {Path(p).parent for p in opened} <= {zoo.SHIPPED / name, zoo.SHIPPED}, opened
        assert zoo.model_dir(name) == zoo.SHIPPED / name
        assert zoo.model_id(name) == f"sandbox:{name}@{zoo.recipe_hash(name)}/sha256:{digest[:16]}"
    assert zoo.build(profile="test", progress=False) == {
        n: zoo.SHIPPED / n for n in zoo.names_for("test")
    }


def test_a_shipped_file_that_changed_is_refused_with_the_way_back(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(zoo.SHIPPED, tmp_path / "models")
    monkeypatch.setattr(zoo, "SHIPPED", tmp_path / "models")
    zoo.verify_shipped.cache_clear()
    name = zoo.names_for("test")[0]
    assert zoo.verify_shipped(name)
    weights = tmp_path / "models" / name / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    zoo.verify_shipped.cache_clear()
    with pytest.raises(
        UserError, match=r"model\.safetensors does not match its sha256.*git checkout"
    ):
        zoo.verify_shipped(name)
    zoo.verify_shipped.cache_clear()


@pytest.fixture(scope="module")
def rebuilt_zoo(tmp_path_factory) -> dict[str, Path]:
    """The smallest test model rebuilt from scratch on the forced fp32 path (COTGAP_PRECISION=fp32):
    the build path, at ~20 s rather than the whole profile's minute."""
    root = Path(os.environ.get("COTGAP_TEST_ZOO_DIR") or tmp_path_factory.mktemp("zoo"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COTGAP_PRECISION", "fp32")
        return zoo.build(["test-student"], progress=False, root=root)


def test_a_rebuild_on_the_fp32_path_records_it_and_is_cached(rebuilt_zoo):
    dirs = rebuilt_zoo
    assert set(dirs) == {"test-student"}
    for name, path in dirs.items():
        assert path.name == f"{name}-{zoo.recipe_hash(name)}"
        for f in (*zoo._REQUIRED, "chat_template.jinja", "generation_config.json"):
            assert (path / f).is_file(), f
        info = json.loads((path / "zoo.json").read_text())
        assert info["model_id"] == f"sandbox:{name}@{zoo.recipe_hash(name)}"
        assert info["steps"] == zoo.ZOO[name].steps
        assert info["precision"] == "fp32" and info["precision_choice"]["requested"] == "fp32"
        assert set(info["accuracy"]) == {g for g, _ in zoo.ZOO[name].mixture}
        shipped = json.loads((zoo.SHIPPED / name / "zoo.json").read_text())
        if shipped["precision"] != "fp32":  # the forced path really trained differently
            ship_weights = (zoo.SHIPPED / name / "model.safetensors").read_bytes()
            assert (path / "model.safetensors").read_bytes() != ship_weights
    mtimes = {n: (p / "zoo.json").stat().st_mtime for n, p in dirs.items()}
    with opened_files() as opened:  # a real build writes weights; a cached one reads a few files
        again = zoo.build(list(dirs), progress=False, root=next(iter(dirs.values())).parent)
    assert not [p for p in opened if p.endswith(".safetensors")], opened
    assert len(opened) <= 4 * len(dirs), opened
    assert again == dirs and mtimes == {
        n: (p / "zoo.json").stat().st_mtime for n, p in again.items()
    }


@pytest.mark.parametrize("profile", ["demo", "test"])
def test_shipped_teachers_differ_and_students_are_weaker(profile):
    dirs = zoo.build(profile=profile, progress=False)
    acc = {n: json.loads((p / "zoo.json").read_text())["accuracy"] for n, p in dirs.items()}
    teachers = [n for n in dirs if zoo.ZOO[n].role == "teacher"]
    students = [n for n in dirs if zoo.ZOO[n].role == "student"]
    task = "sums" if profile == "demo" else "coin_flip"
    if profile == "test":  # the test zoo's teachers differ in accuracy
        spread = max(acc[t][task] for t in teachers) - min(acc[t][task] for t in teachers)
        assert spread >= 0.15, acc
    for s in students:
        if profile == "demo":  # off the floor, with room for a teacher's traces to lift them
            assert 0.1 < acc[s][task] < max(acc[t][task] for t in teachers) - 0.3, acc
        assert sum(acc[s].values()) < max(sum(acc[t].values()) for t in teachers), acc


def test_the_demo_world_is_built_as_docs_sandbox_says():
    """The demo's construction (docs/sandbox.md): two teachers of one style at two sizes, one of
    another style; students of the same data that differ in depth, one layer against two."""
    recipes = {n: zoo.ZOO[n] for n in zoo.names_for("demo")}
    styles = {n: r.styles for n, r in recipes.items() if r.role == "teacher"}
    assert styles == {"teacher-s": ("fine",), "teacher-m": ("fine",), "teacher-l": ("long",)}
    assert recipes["teacher-s"].layers < recipes["teacher-m"].layers == recipes["teacher-l"].layers
    xs, s = recipes["student-xs"], recipes["student-s"]
    assert (xs.layers, s.layers) == (1, 2)
    assert (xs.mixture, xs.styles, xs.hidden) == (s.mixture, s.styles, s.hidden)
    assert set(xs.styles) == set(tasks.styles_of("sums"))


def _prompts(n: int) -> list[str]:
    return [it["question"] for gen in GENERATORS for it in tasks.generate_items(gen, "test", n, 0)]


@pytest.mark.slow
def test_shipped_zoo_loads_in_transformers_and_vllm_with_the_same_greedy_output():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = zoo.build(["test-teacher-l"], progress=False)["test-teacher-l"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert (
        model.generation_config.eos_token_id
        == tok.eos_token_id
        == tok.convert_tokens_to_ids("<|end|>")
    )
    questions = _prompts(2)
    hf = []
    for q in questions:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, return_tensors="pt"
        )["input_ids"]
        out = model.generate(ids, max_new_tokens=zoo.MAX_NEW_TOKENS, do_sample=False)
        hf.append(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))

    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(path), dtype="float32", enforce_eager=True, kv_cache_memory_bytes=1 << 30, seed=0
    )
    sp = SamplingParams(temperature=0.0, max_tokens=zoo.MAX_NEW_TOKENS)
    outs = llm.chat([[{"role": "user", "content": q}] for q in questions], sp, use_tqdm=False)
    vl = [o.outputs[0].text for o in outs]
    assert vl == hf
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)
    assert any(zoo.extract_answer(t) is not None for t in vl)


def test_a_forced_style_is_the_one_the_model_writes_in():
    """benchmarks/sandbox_styles.py forces a style by its opening words (or, for fine, by barring
    the others' first letters): the shipped teachers, each pretrained on one style, score in
    their own style and fail in a style they never saw."""
    from transformers import AutoModelForCausalLM

    from benchmarks import sandbox_styles

    fine = AutoModelForCausalLM.from_pretrained(
        zoo.build(["teacher-s"], progress=False)["teacher-s"]
    )
    long = AutoModelForCausalLM.from_pretrained(
        zoo.build(["teacher-l"], progress=False)["teacher-l"]
    )
    assert sandbox_styles.score(fine, "sums", 40, "fine") >= 0.9
    assert sandbox_styles.score(fine, "sums", 40, "long") <= 0.1
    assert sandbox_styles.score(long, "sums", 40, "long") >= 0.6
    assert sandbox_styles.score(long, "sums", 40, "fine") <= 0.1
