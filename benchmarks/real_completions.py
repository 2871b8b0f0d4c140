"""Benchmark: cotgap's verdicts on real model completions against the original authors' verdicts.

    .venv/bin/python -m benchmarks.real_completions [--data-dir ../shared/data]
        [--sample 3] [--dump results/bench/real_completions.jsonl] [--only faithful-cot]
        [--verdicts results/bench/verdicts.jsonl] [--compare an-earlier-verdicts.jsonl]

Reads every public set in <data-dir>/real-completions (its README describes them): GPT-3 GSM8K
solutions (openai-grade-school-math), GPT-4 / GPT-3.5 few-shot CoT (faithful-cot),
text-davinci-003 Plan-and-Solve (plan-and-solve), chat models on MATH level 5 (zeroeval), GPT-4
zero-shot CoT on three BBH tasks (meta-prompting) and five 2024 open models' 5-shot CoT on
MMLU-Pro (mmlu-pro, ten-option multiple choice, read as the arc_challenge task reads its letters). Each completion is scored by `scoring.score`
under the task cotgap ships for that benchmark (its extractor and headline reading), against the
set's own gold answer; the original verdict is the stored one, or the repository's own scoring
logic re-implemented here where only the extracted answer is stored (each re-implementation
reproduces the counts that the README gives). Prints agreement per set and per task, then
`--sample` disagreements of each task; `--dump` writes every disagreement as JSONL.

Agreement is not accuracy: where the original script misreads a completion (a first number taken
from a whole sentence, a letter found inside a word) a careful reader disagrees with it.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.tasks import answers, scoring
from harness.tasks import suite as tasks

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Case:
    set: str  # the directory under real-completions
    task: str  # cotgap task whose extractor and headline score it
    source: str  # file and record, for the report
    completion: str
    gold: Any  # raw gold, canonicalised by the task's answer type
    original: bool  # the original authors' verdict
    choices: list[str] | None = None


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _options(question: str) -> list[str] | None:
    """Option texts of "(A) x (B) y" inside a question, as Plan-and-Solve's questions list them."""
    parts = re.split(r"\(([A-E])\)\s*", question.partition("Answer Choices:")[2])
    return [p.strip() for p in parts[2::2]] or None


# --- the sets ------------------------------------------------------------------------------------


def openai_gsm8k(root: Path) -> Iterator[Case]:
    path = root / "openai-grade-school-math/grade_school_math/data/example_model_solutions.jsonl"
    for i, rec in enumerate(_jsonl(path)):
        gold = rec["ground_truth"].rpartition("A: ")[2]
        for system in ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"):
            sol = rec[system]
            yield Case(
                "openai-grade-school-math", "gsm8k", f"{system} line {i + 1}",
                sol["solution"], gold, sol["is_correct"],
            )  # fmt: skip


def _faithful_gsm8k(answer: Any, gold: str) -> bool:
    m = re.search(r"(\-?[0-9\.\,]+)", str(answer))
    if not m or answer == "[invalid]":
        return False
    try:
        pred = abs(int(float(m.group(1).replace(",", ""))))
    except ValueError:
        return False
    return pred == int(gold.rpartition("####")[2].strip().replace(",", ""))


def faithful_cot(root: Path) -> Iterator[Case]:
    base = root / "faithful-cot"
    tasks_of = {
        "GSM8K": "gsm8k", "AQUA": "aqua", "StrategyQA": "strategyqa", "date": "date",
        "sports": "bbh_sports_understanding",
    }  # fmt: skip
    for dataset, task in tasks_of.items():
        golds = {g["id"]: g for g in _jsonl(base / f"data/{dataset}/test.jsonl")}
        for model in ("gpt4_COT", "gpt-3.5-turbo_COT"):
            path = base / f"output_dir/{dataset}/test/{model}/predictions.jsonl"
            for rec in _jsonl(path):
                g, ans = golds[rec["id"]], rec["answer"]
                choices = None
                if dataset == "GSM8K":
                    gold, ok = (
                        g["answer"].rpartition("####")[2].strip(),
                        _faithful_gsm8k(ans, g["answer"]),
                    )
                elif dataset == "AQUA":
                    gold, ok = g["answer"], ans == g["answer"]
                    choices = [re.sub(r"^[A-E]\)", "", o) for o in g["options"]]
                elif dataset == "StrategyQA":
                    gold, ok = bool(g["answer"]), ans != "[invalid]" and bool(ans) == g["answer"]
                elif dataset == "date":
                    gold = g["answer"].rpartition("####")[2].strip()
                    ok = ans == gold
                else:  # sports
                    gold = bool(g["answer"])
                    ok = ans != "[invalid]" and bool(int(ans)) == gold
                yield Case(
                    "faithful-cot", task, f"{dataset}/{model} id {rec['id']}",
                    rec["completion"], gold, ok, choices,
                )  # fmt: skip


def plan_and_solve(root: Path) -> Iterator[Case]:
    base = root / "plan-and-solve/generated_result"
    tasks_of = {
        "gsm8k": "gsm8k", "SVAMP": "svamp", "MultiArith": "multiarith", "AddSub": "addsub",
        "SingleEq": "singleeq", "AQuA": "aqua", "CommensenseQA": "commonsenseqa",
        "StrategyQA": "strategyqa", "coin_flip": "coin_flip", "last_letters": "last_letters",
    }  # fmt: skip
    for path in sorted(base.glob("*.json")):
        task = tasks_of[path.name.split("-", 1)[0]]
        for rec in json.loads(path.read_text(encoding="utf-8")):
            choices = _options(rec["question"]) if task in ("aqua", "commonsenseqa") else None
            yield Case(
                "plan-and-solve", task, f"{path.name} {rec['ID']}",
                rec["chain-of-thought"], rec["answer"], rec["ans"], choices,
            )  # fmt: skip


def _zeroeval_verdict(output: str, gold: str, model: str) -> bool:
    """ZeroEval's math_eval: JSON answer, else a regex, else (Llama-3.1) a late \\boxed{}."""
    pred = None
    m = re.search(r"\{.*?\}", output, re.S)
    if m:
        try:
            obj = json.loads(m.group())
            if isinstance(obj, dict) and "answer" in obj:
                pred = str(obj["answer"])
        except json.JSONDecodeError:
            pass
    if pred is None:
        m = re.search(r'"answer"\s*:\s*"?([^"\n}]*)"?', output)
        pred = m.group(1) if m else None
    if pred is None and "Llama-3.1" in model and "boxed" in output[-30:]:
        m = re.search(r"\\boxed{([\w\d]+)}", output)
        pred = m.group(1) if m else None
    if pred is None:
        return False

    def first_number(s: str) -> float | None:
        s = s.replace("$", "").replace(",", "")
        frac = re.fullmatch(r"\s*(-?\d+)\s*/\s*(\d+)\s*", s)
        if frac and int(frac.group(2)):
            return int(frac.group(1)) / int(frac.group(2))
        n = re.search(r"-?\d+(\.\d+)?", s)
        return float(n.group()) if n else None

    p, g = first_number(pred), first_number(gold)
    return p is not None and g is not None and p == g


def zeroeval(root: Path) -> Iterator[Case]:
    for path in sorted((root / "zeroeval/result_dirs/math-l5").glob("*.json")):
        for rec in json.loads(path.read_text(encoding="utf-8")):
            out = rec["output"][0] if rec["output"] else ""
            yield Case(
                "zeroeval", "math", f"{path.stem} id {rec['id']}", out, rec["answer"],
                _zeroeval_verdict(out, rec["answer"], rec["generator"]),
            )  # fmt: skip


def _meta_prompting_verdict(output: str, target: str, task: str) -> bool:
    text = output.lower()
    marker = '>> final answer:\n"""'
    if marker not in text:
        return False
    ans = text.rpartition(marker)[2].split('"""', 1)[0].strip()
    if task == "geometric_shapes":
        return ans.startswith(target.lower())
    ans = re.sub(r'[,;:."]', "", ans).replace("\n", " ")
    return ans == target.lower()


def meta_prompting(root: Path) -> Iterator[Case]:
    for task in ("geometric_shapes", "multistep_arithmetic_two", "word_sorting"):
        path = root / f"meta-prompting/outputs/ZeroShotCoT/{task}-zero-shot-cot.jsonl"
        for i, rec in enumerate(_jsonl(path)):
            choices = tasks._options_in_question(rec["input"]) or None
            yield Case(
                "meta-prompting", f"bbh_{task}", f"{path.name} line {i + 1}", rec["output"],
                rec["target"], _meta_prompting_verdict(rec["output"], rec["target"], task), choices,
            )  # fmt: skip


def mmlu_pro(root: Path) -> Iterator[Case]:
    """MMLU-Pro 5-shot CoT of five open models: the authors' verdict is `pred == answer` (a missing
    `pred` they replaced by a random guess, which is not stored: here it is no answer)."""
    import zipfile

    for path in sorted((root / "mmlu-pro/eval_results").glob("*.zip")):
        model = path.stem.removeprefix("model_outputs_").removesuffix("_5shots")
        with zipfile.ZipFile(path) as z:
            records = json.loads(z.read(z.namelist()[0]))
        for rec in records:
            yield Case(
                "mmlu-pro", "mmlu_pro", f"{model} qid {rec['question_id']}",
                rec["generated_text"] or "", rec["answer"],
                rec["pred"] is not None and rec["pred"] == rec["answer"], list(rec["options"]),
            )  # fmt: skip


SETS = {
    "openai-grade-school-math": openai_gsm8k,
    "faithful-cot": faithful_cot,
    "plan-and-solve": plan_and_solve,
    "zeroeval": zeroeval,
    "meta-prompting": meta_prompting,
    "mmlu-pro": mmlu_pro,
}


# --- scoring ----------------------------------------------------------------------------------------


def _spec(task: str) -> tasks.TaskSpec:
    if task == "date":  # free-form MM/DD/YYYY answers (Faithful-CoT's BIG-bench date)
        spec = tasks.load_task("date_understanding")
        return spec.model_copy(update={"name": "date", "answer_type": "date", "extractor": "date"})
    if task == "mmlu_pro":  # ten-option multiple choice, read as cotgap reads ARC's
        return tasks.load_task("arc_challenge").model_copy(update={"name": "mmlu_pro"})
    return tasks.load_task(task)


def score_case(case: Case) -> dict[str, Any]:
    spec = _spec(case.task)
    gold = answers.canonical(spec.answer_type, case.gold)
    return scoring.score(spec, case.completion, gold, choices=case.choices)


def run(root: Path, only: list[str] | None = None) -> dict[str, Any]:
    """Agreement per set and task: {set: {task: {n, agree, disagreements: [...]}}}."""
    out: dict[str, dict[str, dict]] = {}
    for name, reader in SETS.items():
        if only and name not in only:
            continue
        per_task: dict[str, dict] = defaultdict(
            lambda: {"n": 0, "agree": 0, "disagreements": [], "verdicts": {}}
        )
        for case in reader(root / "real-completions"):
            verdict = score_case(case)
            row = per_task[case.task]
            row["n"] += 1
            row["verdicts"][case.source] = (case.original, verdict["correct"])
            if verdict["correct"] == case.original:
                row["agree"] += 1
            else:
                row["disagreements"].append(
                    {
                        "source": case.source,
                        "gold": str(case.gold),
                        "original": case.original,
                        "cotgap": verdict["correct"],
                        **{k: verdict.get(k) for k in ("strict", "flexible", "explain")},
                        "tail": case.completion[-300:],
                    }
                )
        out[name] = dict(per_task)
    return out


def write_verdicts(result: dict[str, Any], path: Path) -> None:
    """One line per item: set, source, the original verdict and cotgap's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for name, per_task in result.items():
            for r in per_task.values():
                for source, (original, ours) in r["verdicts"].items():
                    rec = {"set": name, "source": source, "original": original, "cotgap": ours}
                    f.write(json.dumps(rec) + "\n")


def compare(result: dict[str, Any], earlier: Path) -> None:
    """Per set, against an earlier --verdicts file: misses (the authors right, cotgap wrong)
    then and now, the earlier misses fixed, and the share of the items where cotgap and the
    authors agreed then whose verdict is unchanged (kept). Of the agreeing items that changed,
    `to gold` now read the gold answer where the authors scored them wrong (their grader missed
    it, or cotgap misreads into the gold: read them), `broken` are now wrong where the authors
    scored them right."""
    before = {}
    for line in earlier.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        before[rec["set"], rec["source"]] = rec["cotgap"]
    head = f"{'misses then':>11} {'now':>6} {'fixed':>6} {'kept':>8} {'to gold':>8} {'broken':>7}"
    print(f"\n{'set':<26} {head}")
    for name, per_task in result.items():
        now = {s: v for r in per_task.values() for s, v in r["verdicts"].items()}
        then = {s: before[name, s] for s in now if (name, s) in before}
        miss_then = [s for s in then if now[s][0] and not then[s]]
        miss_now = [s for s, (orig, ours) in now.items() if orig and not ours]
        fixed = sum(now[s][1] for s in miss_then)
        agreed = [s for s in then if then[s] == now[s][0]]
        changed = [s for s in agreed if now[s][1] != then[s]]
        kept = 1 - len(changed) / max(1, len(agreed))
        to_gold = sum(now[s][1] for s in changed)
        print(f"{name:<26} {len(miss_then):>11} {len(miss_now):>6} {fixed:>6} {100 * kept:>7.2f}% "
              f"{to_gold:>8} {len(changed) - to_gold:>7}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--sample", type=int, default=3, help="disagreements shown per task")
    p.add_argument("--dump", type=Path, default=None, help="write every disagreement here")
    p.add_argument("--only", default=None, help="comma-separated set names")
    p.add_argument("--verdicts", type=Path, default=None, help="write every item's verdicts here")
    p.add_argument("--compare", type=Path, default=None, help="an earlier --verdicts file")
    args = p.parse_args(argv)
    result = run(args.data_dir, args.only.split(",") if args.only else None)
    if args.verdicts:
        write_verdicts(result, args.verdicts)
    total_n = total_agree = 0
    print(f"{'set':<26} {'task':<28} {'n':>6} {'agree':>7}")
    for name, per_task in result.items():
        set_n = sum(r["n"] for r in per_task.values())
        set_agree = sum(r["agree"] for r in per_task.values())
        total_n, total_agree = total_n + set_n, total_agree + set_agree
        for task, r in sorted(per_task.items()):
            print(f"{name:<26} {task:<28} {r['n']:>6} {100 * r['agree'] / r['n']:>6.1f}%")
        print(f"{name:<26} {'(all)':<28} {set_n:>6} {100 * set_agree / max(set_n, 1):>6.1f}%")
    print(f"{'overall':<55} {total_n:>6} {100 * total_agree / max(total_n, 1):>6.1f}%")
    if args.compare:
        compare(result, args.compare)
    for name, per_task in result.items():
        for task, r in sorted(per_task.items()):
            for d in r["disagreements"][: args.sample]:
                print(f"\n[{name} {task}] {d['source']} gold={d['gold']!r} original={d['original']} "
                      f"cotgap={d['cotgap']} strict={d['strict']!r} flexible={d['flexible']!r}")  # fmt: skip
                print("   ..." + d["tail"][-200:].replace("\n", "\\n"))
    if args.dump:
        args.dump.parent.mkdir(parents=True, exist_ok=True)
        with args.dump.open("w", encoding="utf-8") as f:
            for name, per_task in result.items():
                for task, r in per_task.items():
                    for d in r["disagreements"]:
                        f.write(
                            json.dumps({"set": name, "task": task, **d}, ensure_ascii=False) + "\n"
                        )


if __name__ == "__main__":
    main()
