"""Bad input through the real CLI: exit 2, one paragraph naming the file / row / key and what to do,
no traceback, nothing half-written, earlier results untouched.

    .venv/bin/pytest tests/test_bad_input.py -q

Every case runs `python -m harness ...` in a subprocess (offline) inside a workspace that already
holds a complete cell and an analysis; after the command, every file that was there has the same
bytes and the only new files are stage logs; no lock file stays behind.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from harness.store import sha256_file

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bad_input"
DISK_FULL = FIXTURES / "disk_full.py"
_VENV_PY = REPO / ".venv" / "bin" / "python"
PY = str(_VENV_PY) if _VENV_PY.exists() else sys.executable
CELL_KEY = "0123456789abcdef0123"  # a complete eval cell of an earlier run (not in these configs)
GSM8K_ROW = {"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"}
SANDBOX_ID = "addition-test-1234-0"  # the first test item of sandbox_addition

INDEX = ("index.csv", "by-name")  # the cells by name, written after every run


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COTGAP_")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.update(extra)
    return env


@dataclass
class Workspace:
    """tmp_path with an earlier run's results, a config writer and a data-dir writer."""

    root: Path

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def config(
        self, mutate: Callable[[dict], None] | None = None, folders: tuple[str, ...] | list = ()
    ) -> Path:
        """exp.yaml (after `mutate`), with `folders` made next to it."""
        for folder in folders:
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        cfg = {
            "name": "t",
            "results_dir": str(self.results),
            "teachers": [{"name": "big", "path": "sandbox:teacher-l"}],
            "students": [{"name": "small", "path": "sandbox:student-s"}],
            "tasks": ["sandbox_addition"],
            "train": {"max_steps": 10},
        }
        if mutate:
            mutate(cfg)
        path = self.root / "exp.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def raw(self, name: str, data: bytes | str) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        return path

    def jsonl(self, name: str, rows: list) -> Path:
        return self.raw(
            name, "".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows)
        )

    def files(self) -> dict[str, bytes]:
        """Every file but lock files (a lock's holder removes its file when it lets go)."""
        return {
            str(p.relative_to(self.root)): p.read_bytes()
            for p in sorted(self.root.rglob("*"))
            if p.is_file() and p.name != ".lock"
        }


def make_workspace(root: Path) -> Workspace:
    ws = Workspace(root)
    cell = ws.results / "t" / "cells" / "eval" / CELL_KEY
    cell.mkdir(parents=True)
    (cell / "predictions.jsonl").write_text(
        json.dumps({"id": SANDBOX_ID, "completion": "9"}) + "\n"
    )
    (cell / "metrics.json").write_text('{"accuracy": 0.5}\n')
    outputs = {n: sha256_file(cell / n) for n in ("predictions.jsonl", "metrics.json")}
    manifest = {"kind": "eval", "key": CELL_KEY, "outputs": outputs, "summary": {}}
    (cell / "manifest.json").write_text(json.dumps(manifest) + "\n")
    (ws.results / "t" / "analysis").mkdir()
    (ws.results / "t" / "analysis" / "leaderboard.csv").write_text("earlier,leaderboard\n")
    return ws


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_workspace(tmp_path)


def cotgap(ws: Workspace, *args: object, env: dict | None = None, wrapper: Path | None = None):
    cmd = [PY, str(wrapper)] if wrapper else [PY, "-m", "harness"]
    return subprocess.run(
        [*cmd, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ws.root,
        env=env or _env(),
        timeout=300,
    )


def error_message(out: subprocess.CompletedProcess, code: int = 2) -> str:
    """The error paragraph of a failed command, after the checks every bad input must pass."""
    report = (
        f"exit {out.returncode}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-6000:]}"
    )
    assert out.returncode == code, report
    assert "Traceback" not in out.stderr, report
    assert "error: " in out.stderr, report
    msg = out.stderr[out.stderr.index("error: ") :].strip()
    assert "\n\n" not in msg and len(msg) < 3000, f"not one short paragraph:\n{msg[:3000]}"
    return msg


def assert_untouched(ws: Workspace, before: dict[str, bytes]) -> None:
    after = ws.files()
    appended = lambda p: Path(p).parent.name == "logs" and after.get(p, b"").startswith(before[p])  # noqa: E731
    changed = [p for p in before if after.get(p) != before[p] and not appended(p)]
    assert not changed, f"changed or removed: {changed}"  # logs (events.jsonl too) only grow
    new = [p for p in after if p not in before]
    allowed = [p for p in new if Path(p).parent.name == "logs"]
    assert sorted(new) == sorted(allowed), f"left behind: {sorted(set(new) - set(allowed))}"
    leftovers = [p for p in ws.root.rglob("*") if ".tmp" in p.name or p.name.endswith(".lock")]
    assert not leftovers, f"temporary or lock files left: {leftovers}"


# --- cases: (setup(ws) -> argv, text the message must hold) --------------------------------------


def _set(path: str, value: object) -> Callable[[dict], None]:
    """A config mutation: set `a.b[0].c` to value (creating mappings on the way)."""

    def mutate(cfg: dict) -> None:
        parts = path.replace("[", ".[").split(".")
        node = cfg
        for part, nxt in zip(parts, [*parts[1:], None], strict=True):
            key: object = int(part[1:-1]) if part.startswith("[") else part
            if nxt is None:
                node[key] = copy.deepcopy(value)
            else:
                if isinstance(key, str) and key not in node:
                    node[key] = {}
                node = node[key]

    return mutate


def _cfg_case(cmd: str, mutate: Callable[[dict], None], *needles: str):
    def setup(ws: Workspace) -> tuple[list, tuple[str, ...]]:
        path = ws.config(mutate)
        return [cmd, path], (str(path), *needles)

    return setup


def _model_case(cmd: str, mutate: Callable[[dict], None], *needles: str):
    """A model entry that validates but cannot be used: named by its model name, found at plan time."""

    def setup(ws: Workspace) -> tuple[list, tuple[str, ...]]:
        return [cmd, ws.config(mutate)], (*needles, "fix the path in the config")

    return setup


def _raw_cfg_case(cmd: str, text: bytes | str, *needles: str):
    def setup(ws: Workspace) -> tuple[list, tuple[str, ...]]:
        path = ws.raw("exp.yaml", text)
        return [cmd, path], (str(path), *needles)

    return setup


def _gsm8k_case(rows: list | bytes, *needles: str):
    def setup(ws: Workspace) -> tuple[list, tuple[str, ...]]:
        name = "data/gsm8k/test.jsonl"
        path = ws.raw(name, rows) if isinstance(rows, bytes) else ws.jsonl(name, rows)
        args = ["ls", "items", "gsm8k", "--split", "test", "--data-dir", ws.data]
        return args, (str(path), *needles)

    return setup


def _score_case(rows: list | bytes, *needles: str):
    def setup(ws: Workspace) -> tuple[list, tuple[str, ...]]:
        path = (
            ws.raw("preds.jsonl", rows)
            if isinstance(rows, bytes)
            else ws.jsonl("preds.jsonl", rows)
        )
        args = ["score", "--task", "sandbox_addition", "--predictions", path]
        return args, (str(path), *needles)

    return setup


def _plain(args: Callable[[Workspace], list], *needles: str):
    def setup(ws: Workspace) -> tuple[list, tuple[str, ...]]:
        return args(ws), needles

    return setup


def _csqa_duplicate_ids(ws: Workspace) -> tuple[list, tuple[str, ...]]:
    def row(i: str) -> dict:
        q = {
            "stem": f"Question {i}?",
            "choices": [{"label": "A", "text": "a"}, {"label": "B", "text": "b"}],
        }
        return {"id": i, "question": {**q, "question_concept": "c"}, "answerKey": "A"}

    ws.jsonl("data/commonsenseqa/dev_rand_split.jsonl", [row("q1"), row("q2"), row("q1")])
    args = ["ls", "items", "commonsenseqa", "--split", "test", "--data-dir", ws.data]
    path = ws.data / "commonsenseqa" / "dev_rand_split.jsonl"
    rows = f"rows: {path} line 1 and {path} line 3"
    return args, ("task commonsenseqa: id 'q1' appears twice", rows, "ids must be unique")


def _damaged_cell(damage: Callable[[Path], None], *args: str):
    """The earlier run's complete cell, damaged; `cotgap <args>` on it names the cell."""

    def setup(ws: Workspace) -> tuple[list, tuple[str, ...]]:
        cell = ws.results / "t" / "cells" / "eval" / CELL_KEY
        damage(cell)
        argv = [a.replace("CONFIG", str(ws.config())).replace("RESULTS", str(ws.results / "t"))
                for a in args]  # fmt: skip
        return argv, ()

    return setup


def _truncate(path: str) -> Callable[[Path], None]:
    return lambda cell: (cell / path).write_bytes((cell / path).read_bytes()[:25])


def _huge_jsonl_row(ws: Workspace) -> tuple[list, tuple[str, ...]]:
    path = ws.data / "gsm8k" / "test.jsonl"
    path.parent.mkdir(parents=True)
    with path.open("w") as f:  # a 50 MB row that is not JSON (a trailing comma)
        f.write('{"question": "' + "x" * (50 << 20) + '", "answer": "#### 1",}\n')
    args = ["ls", "items", "gsm8k", "--split", "test", "--data-dir", ws.data]
    return args, (str(path), "line 1", "not valid JSON", "one JSON object per line")


def _huge_prediction(ws: Workspace) -> tuple[list, tuple[str, ...]]:
    path = ws.root / "preds.jsonl"  # a 50 MB line without the completion field
    path.write_text(json.dumps({"id": SANDBOX_ID, "text": "7" * (50 << 20)}) + "\n")
    args = ["score", "--task", "sandbox_addition", "--predictions", path]
    return args, (str(path), "line 1", "'completion' is missing")


def _score_out_is_a_directory(ws: Workspace) -> tuple[list, tuple[str, ...]]:
    preds = ws.jsonl("preds.jsonl", [{"id": SANDBOX_ID, "completion": "5"}])
    args = ["score", "--task", "sandbox_addition", "--predictions", preds, "--out", ws.results]
    return args, (f"--out {ws.results}: is a directory; give a file path", "Nothing was written")


CASES = {
    # --- the experiment YAML ---
    "malformed_yaml": _raw_cfg_case(
        "run", "name: t\nteachers: [unclosed\n", "line 3", "malformed YAML"
    ),
    "yaml_python_tag": _raw_cfg_case(
        "run", "!!python/object/apply:os.system ['touch pwned']\n", "malformed YAML"
    ),
    "yaml_not_a_mapping": _raw_cfg_case("plan", "- a\n- b\n", "expected a mapping"),
    "duplicate_key": _raw_cfg_case(
        "validate",
        "name: t\ntrain: {max_steps: 10}\nteachers: [{name: a, path: 'sandbox:teacher-l'}]\n"
        "students: [{name: b, path: 'sandbox:student-s'}]\ntasks: [sandbox_addition]\n"
        "train:\n  max_steps: 3\n",
        "duplicate key 'train' (lines 2 and 6)",
    ),
    "duplicate_key_nested": _raw_cfg_case(
        "run",
        "name: t\ntrain: {max_steps: 10}\nteachers:\n  - name: a\n    path: 'sandbox:teacher-l'\n"
        "    name: b\nstudents: [{name: c, path: 'sandbox:student-s'}]\ntasks: [sandbox_addition]\n",
        "duplicate key 'name' (lines 4 and 6)",
    ),
    "empty_yaml": _raw_cfg_case("run", "", "expected a mapping", "got an empty file"),
    "non_utf8_config": _raw_cfg_case(
        "validate", b"name: caf\xe9\n", "not UTF-8", "save it as UTF-8"
    ),
    "huge_yaml_scalar": _raw_cfg_case(
        "validate",
        "name: " + "n" * (2 << 20) + "\n",
        "name: String should match pattern",
        "teachers: Field required",
    ),
    "wrong_type": _cfg_case("run", _set("generate.n", "four"), "generate.n", "valid integer"),
    "seed_past_numpy_range": _cfg_case(
        "validate",
        _set("train.seeds", [2**32]),
        "train.seeds[0]",
        "less than or equal to 4294967295",
    ),
    "negative_seed": _cfg_case("run", _set("analysis.seed", -1), "analysis.seed", "greater than"),
    "nan_gap_bin": _raw_cfg_case(
        "validate",
        "name: t\ntrain: {max_steps: 10}\nteachers: [{name: a, path: 'sandbox:teacher-l'}]\n"
        "students: [{name: b, path: 'sandbox:student-s'}]\ntasks: [sandbox_addition]\n"
        "analysis: {gap_bins: [0, .nan, 100]}\ncosts: {device_hour: .inf}\n",
        "analysis.gap_bins[1]: Input should be a finite number",
        "costs.device_hour: Input should be a finite number",
    ),
    "teacher_compared_with_itself": _cfg_case(
        "validate", _set("analysis.delta_large", ["big", "big"]), "compares a teacher with itself"
    ),
    "absurd_bootstrap": _cfg_case(
        "validate", _set("analysis.bootstrap_samples", 10**12), "analysis.bootstrap_samples"
    ),
    "wrong_type_nested": _cfg_case(
        "plan", _set("teachers[0].engine.max_model_len", "long"), "teachers[0].engine.max_model_len"
    ),
    "unknown_key_top": _cfg_case(
        "run", _set("genrate", {"n": 2}), "genrate: unknown key; did you mean 'generate'?"
    ),
    "unknown_key_nested": _cfg_case(
        "run",
        _set("teachers[0].engine.gpu_memory_utilizaton", 0.5),
        "teachers[0].engine.gpu_memory_utilizaton: unknown key; did you mean 'gpu_memory_utilization'?",
    ),
    "unknown_key_deep": _cfg_case(
        "plan", _set("train.lora.alpah", 8), "train.lora.alpah: unknown key; did you mean 'alpha'?"
    ),
    "unknown_task": _cfg_case(
        "run",
        _set("tasks", ["gsm8kk"]),
        "tasks[0].name: unknown task 'gsm8kk'; did you mean 'gsm8k'?",
    ),
    "unknown_key_and_task_at_once": _raw_cfg_case(
        "validate",
        "name: t\ntrain: {max_stepz: 10}\nteachers: [{name: a, path: 'sandbox:teacher-l'}]\n"
        "students: [{name: b, path: 'sandbox:student-s'}]\n"
        "tasks: [sandbox_coin_flip, {name: sandbox_additon, test_limit: 5}]\n",
        "train.max_stepz: unknown key; did you mean 'max_steps'?",
        "tasks[1].name: unknown task 'sandbox_additon'; did you mean 'sandbox_addition'?",
    ),
    "unknown_extractor": _cfg_case(
        "run",
        _set("evaluate.extractor", "numbr"),
        "evaluate.extractor: unknown extractor 'numbr'",
        "valid: choice, date, math, number",
    ),
    "list_given_a_string": _cfg_case(
        "run",
        _set("tasks", "sandbox_addition"),
        "tasks: expected a list ([a, b] or '- a' lines), got str",
    ),
    "list_given_a_number": _cfg_case(
        "plan",
        _set("train.seeds", 0),
        "train.seeds: expected a list ([a, b] or '- a' lines), got int",
    ),
    "mapping_given_a_list": _cfg_case(
        "run", _set("train", [10]), "train: expected a mapping ('key: value' lines), got list"
    ),
    "zero_steps": _cfg_case("run", _set("train.max_steps", 0), "train.max_steps", "greater than 0"),
    "negative_n": _cfg_case(
        "run", _set("generate.n", -1), "generate.n", "greater than or equal to 1"
    ),
    "negative_limit": _cfg_case(
        "run",
        _set("tasks", [{"name": "sandbox_addition", "test_limit": -3}]),
        "tasks[0].test_limit: Input should be greater than 0",
    ),
    "greedy_with_n": _cfg_case(
        "run", _set("evaluate.n", 4), "evaluate: decoding: greedy needs n: 1 and temperature: 0"
    ),
    "steps_and_epochs": _cfg_case(
        "run", _set("train.epochs", 2), "train: set exactly one of max_steps or epochs"
    ),
    "chat_template_not_bool": _cfg_case(
        "run",
        _set("teachers[0].chat_template", "maybe"),
        "teachers[0].chat_template",
        "valid boolean",
    ),
    "chat_template_a_list": _cfg_case(
        "run",
        _set("students[0].chat_template", [True]),
        "students[0].chat_template",
        "valid boolean",
    ),
    "duplicate_model_names": _cfg_case(
        "run", _set("students[0].name", "big"), "model names must be unique", "['big']"
    ),
    "empty_teachers": _cfg_case("run", _set("teachers", []), "teachers: needs at least 1 item"),
    "model_name_traversal": _cfg_case(
        "run",
        _set("teachers[0].name", "../../etc"),
        "teachers[0].name: String should match pattern",
    ),
    "experiment_name_traversal": _cfg_case(
        "run", _set("name", "../x"), "name: String should match pattern"
    ),
    # --- models (reported by plan / run, before any work) ---
    "missing_local_model_plan": _model_case(
        "plan",
        _set("teachers[0].path", "./models/not-there"),
        "model 'big': path '",  # taken relative to the config file
        "/models/not-there' is not an existing directory",
    ),
    "missing_local_model_run": _model_case(
        "run",
        _set("students[0].path", "/nonexistent/cotgap/student"),
        "model 'small'",
        "'/nonexistent/cotgap/student' is not an existing directory",
    ),
    "unknown_sandbox_model": _model_case(
        "plan",
        _set("teachers[0].path", "sandbox:teacher-xxl"),
        "model 'big': unknown sandbox model 'teacher-xxl'",
        "valid: student-s, student-xs",
    ),
    "missing_local_model_validate": _model_case(
        "validate",
        _set("students[0].path", "./models/not-there"),
        "model 'small': path '",
        "/models/not-there' is not an existing directory",
    ),
    # the config named relative to the working directory: "./models/x" stays a folder, never a
    # hub id "models/x" that only fails at run time
    **{
        f"missing_local_model_relative_config_{cmd}": _plain(
            lambda ws, cmd=cmd: [
                cmd,
                ws.config(_set("students[0].path", "./models/not-there")).name,
            ],
            "model 'small': path '",
            f"{os.sep}models{os.sep}not-there' is not an existing directory",
            "relative to the config file's folder",
        )
        for cmd in ("validate", "plan")
    },
    # org/name where `org` is a folder next to the config: a mistyped local path, said at
    # validate with the folder it was meant to be, not a hub id that fails at run time
    "mistyped_model_under_a_folder_validate": _plain(
        lambda ws: [
            "validate",
            ws.config(_set("students[0].path", "models/my-studnet"), folders=["models/my-student"]),
        ],
        "model 'small': path '",
        f"{os.sep}models{os.sep}my-studnet' is not an existing directory",
        f"did you mean '{os.sep}",
        f"{os.sep}models{os.sep}my-student'?",
    ),
    # --- CLI options ---
    "unknown_stage": _plain(
        lambda ws: ["run", ws.config(), "--only", "trian"],
        "--only: 'trian' is not a stage",
        "generate, train, evaluate",
    ),
    "adapter_not_an_adapter": _plain(
        lambda ws: [
            "evaluate",
            ws.config(),
            "--model",
            "small",
            "--adapter",
            ws.raw("not-adapter/README.md", "hi").parent,
        ],
        "not-adapter: no adapter_config.json there; give a PEFT adapter directory",
    ),
    "adapter_without_model": _plain(
        lambda ws: ["evaluate", ws.config(), "--adapter", ws.root], "--adapter needs --model NAME"
    ),
    "unknown_teacher_option": _plain(
        lambda ws: ["generate", ws.config(), "--teacher", "nobody"],
        "no model named 'nobody'",
        "valid: ['big', 'small']",
    ),
    "task_option_traversal": _plain(
        lambda ws: ["generate", ws.config(), "--task", "../x"], "no task named '../x'"
    ),
    "score_task_traversal": _plain(
        lambda ws: [
            "score",
            "--task",
            "../configs/sandbox",
            "--predictions",
            ws.jsonl("preds.jsonl", [{"id": SANDBOX_ID, "completion": "1"}]),
        ],
        "unknown task '../configs/sandbox' (tasks are the *.yaml files in",
        "cotgap ls tasks",
    ),
    # --- data files ---
    "ls_unknown_task": _plain(
        lambda ws: ["ls", "items", "gsm8kk", "--split", "test"], "unknown task 'gsm8kk'", "'gsm8k'"
    ),
    "ls_bad_split": _plain(
        lambda ws: ["ls", "items", "sandbox_addition", "--split", "tset"],
        "unknown split 'tset' for task sandbox_addition; valid: train, test, all",
    ),
    "data_dir_missing": _plain(
        lambda ws: ["ls", "items", "gsm8k", "--data-dir", ws.root / "no-such-dir"],
        "no-such-dir/gsm8k/test.jsonl: no such file",
        "COTGAP_DATA_DIR",
    ),
    "data_dir_without_task_file": _plain(
        lambda ws: [
            "ls",
            "items",
            "gsm8k",
            "--split",
            "train",
            "--data-dir",
            ws.raw("data/x", "").parent,
        ],
        "data/gsm8k/train.jsonl: no such file; task gsm8k reads gsm8k/train.jsonl",
        "Copy the original file there",
    ),
    "empty_data_file": _gsm8k_case([], "holds no records", "task gsm8k"),
    "row_without_gold": _gsm8k_case(
        [GSM8K_ROW, {"question": "And now?"}], "line 2", "field 'answer' (gold answer) is missing"
    ),
    "row_gold_not_a_number": _gsm8k_case(
        [{"question": "q?", "answer": "#### banana"}],
        "line 1",
        "gold answer ' banana' is not a valid number",
    ),
    "row_without_question": _gsm8k_case(
        [GSM8K_ROW, GSM8K_ROW, {"question": "  ", "answer": "#### 1"}],
        "line 3",
        "field 'question' (question) must be non-empty text",
    ),
    "row_not_an_object": _gsm8k_case(
        [GSM8K_ROW, [1, 2]], "line 2: expected a JSON object, got list"
    ),
    "row_bad_json": _gsm8k_case([GSM8K_ROW, '{"question": "q", \n'], "line 2: not valid JSON"),
    "non_utf8_data": _gsm8k_case(
        json.dumps(GSM8K_ROW).encode() + b'\n{"question": "caf\xe9?", "answer": "#### 1"}\n',
        "line 2: not UTF-8 text",
        "save the file as UTF-8",
    ),
    "duplicate_ids": _csqa_duplicate_ids,
    "huge_jsonl_row": _huge_jsonl_row,
    # --- cotgap score ---
    "score_bad_json_line_3": _score_case(
        [{"id": SANDBOX_ID, "completion": "5"}, "\n", '{"id": "x", completion}\n'],
        "line 3: not valid JSON",
    ),
    "score_missing_completion": _score_case(
        [{"id": SANDBOX_ID, "text": "5"}], "line 1: field 'completion' is missing"
    ),
    "score_id_not_in_split": _score_case(
        [{"id": SANDBOX_ID, "completion": "5"}, {"id": "gsm8k-test-0", "completion": "5"}],
        "line 2: id 'gsm8k-test-0' is not in the test split of task sandbox_addition",
    ),
    "score_duplicate_prediction": _score_case(
        [{"id": SANDBOX_ID, "completion": "5"}] * 2, "line 2", "appears twice"
    ),
    "score_non_utf8": _score_case(
        b'{"id": "' + SANDBOX_ID.encode() + b'", "completion": "\xff"}\n', "line 1: not UTF-8"
    ),
    "score_missing_file": _plain(
        lambda ws: ["score", "--task", "sandbox_addition", "--predictions", ws.root / "nope.jsonl"],
        "nope.jsonl: no such file",
    ),
    "score_out_is_a_directory": _score_out_is_a_directory,
    "huge_prediction_line": _huge_prediction,
    # --- damaged project files (an earlier run's complete cell) ---
    "truncated_manifest": _damaged_cell(_truncate("manifest.json"), "ls", "cells", "CONFIG"),
    "manifest_not_a_manifest": _damaged_cell(
        lambda cell: (cell / "manifest.json").write_text("[]\n"), "ls", "cells", "CONFIG"
    ),
    "check_finds_a_truncated_manifest": _damaged_cell(
        _truncate("manifest.json"), "check", "RESULTS"
    ),
    "check_finds_a_changed_output": _damaged_cell(
        lambda cell: (cell / "metrics.json").write_text('{"accuracy": 0.9}\n'), "check", "CONFIG"
    ),
    "check_finds_a_missing_output": _damaged_cell(
        lambda cell: (cell / "predictions.jsonl").unlink(), "check", "RESULTS"
    ),
    # --- the results directory ---
    "results_dir_is_a_file": _plain(
        lambda ws: ["run", ws.config(_set("results_dir", str(ws.raw("occupied", "x"))))],
        "occupied",
        "a file stands where a directory is expected",
    ),
}


DAMAGED = {  # what a damaged-cell case's message must say, beyond the cell's path
    "truncated_manifest": ("manifest.json: damaged (", "delete", "re-run to recompute"),
    "manifest_not_a_manifest": ("manifest.json: not a cell manifest", "delete"),
    "check_finds_a_truncated_manifest": ("1 of 1 complete cells are damaged", "manifest.json is damaged"),
    "check_finds_a_changed_output": ("metrics.json differs from its manifest hash", "Delete"),
    "check_finds_a_missing_output": ("predictions.jsonl is missing", "re-run to recompute"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_exits_2_with_context(ws: Workspace, case: str) -> None:
    args, needles = CASES[case](ws)
    if case in DAMAGED:
        needles = (*DAMAGED[case], f"eval/{CELL_KEY}" if "check" in case else CELL_KEY)
    before = ws.files()
    out = cotgap(ws, *args)
    msg = error_message(out)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in:\n{msg}"
    assert_untouched(ws, before)
    assert not (ws.root / "pwned").exists()


# --- cases that start a stage: the model is resolved where the engine would start ----------------


def test_hub_id_while_offline(ws: Workspace) -> None:
    cfg = ws.config(_set("teachers[0].path", "no-such-org/no-such-model"))
    before = ws.files()
    msg = error_message(cotgap(ws, "run", cfg, "--only", "generate"))
    for needle in (
        "model 'big'",
        "'no-such-org/no-such-model' is a hub id",
        "offline",
        "local directory",
    ):
        assert needle in msg, msg
    assert_untouched(ws, before)
    assert not (ws.results / "t" / "cells" / "traces").exists()


def test_sandbox_model_not_built(ws: Workspace) -> None:
    cfg = ws.config()
    before = ws.files()
    # the shipped zoo is always there: ask for this machine's rebuild, of which there is none
    env = _env(COTGAP_ZOO_DIR=str(ws.root / "empty-zoo"), COTGAP_ZOO="rebuilt")
    msg = error_message(cotgap(ws, "generate", cfg, "--teacher", "big", env=env))
    assert "sandbox model 'teacher-l' is not built yet; run `cotgap sandbox build`" in msg, msg
    assert_untouched(ws, before)


# --- two runs on one results directory -----------------------------------------------------------

HOLD_LOCK = (
    "import sys\nfrom harness.store import Store\n"
    "with Store(sys.argv[1]).lock():\n    print('locked', flush=True)\n    sys.stdin.read()\n"
)


@pytest.mark.parametrize("wait", [None, 0.5])
def test_results_directory_in_use(ws: Workspace, wait: float | None) -> None:
    cfg = ws.config()
    holder = subprocess.Popen(
        [PY, "-c", HOLD_LOCK, str(ws.results / "t")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = ws.files()
        start = time.time()
        out = cotgap(ws, "run", cfg, *(["--wait", wait] if wait else []))
        elapsed = time.time() - start
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    msg = error_message(out)
    assert "another cotgap process is using this results directory" in msg, msg
    assert str(ws.results / "t" / ".lock") in msg and "--wait SECONDS" in msg, msg
    if wait:
        assert elapsed >= wait, f"gave up after {elapsed:.2f} s, before --wait {wait}"
    assert_untouched(ws, before)


# --- a full disk ---------------------------------------------------------------------------------


@pytest.mark.parametrize("writes_before_full", [0, 3], ids=["first_write", "report_write"])
def test_disk_full_while_analysing(ws: Workspace, writes_before_full: int) -> None:
    """analyze writes leaderboard.csv, answers.csv, analysis.json (atomic_write_*), then the plots' data and report.md."""
    cfg = ws.config()
    before = ws.files()
    env = _env(FULL_UNDER=str(ws.results), FULL_AFTER=str(writes_before_full))
    msg = error_message(cotgap(ws, "analyze", cfg, env=env, wrapper=DISK_FULL))
    assert "No space left on device" in msg and "free disk space" in msg, msg
    if writes_before_full == 0:  # atomic_write_text names the file it was writing
        assert "leaderboard.csv: could not write" in msg, msg
    else:
        assert f"{ws.results / 't' / 'analysis'}: could not write the analysis" in msg, msg
    assert_untouched(ws, before)  # the earlier analysis/ is still there, byte for byte
    left = sorted(p.name for p in (ws.results / "t").iterdir() if p.name not in INDEX)
    assert left == ["analysis", "cells"]


def test_disk_full_while_scoring(ws: Workspace) -> None:
    preds = ws.jsonl("preds.jsonl", [{"id": SANDBOX_ID, "completion": "5"}])
    scored = ws.raw("out/preds.scored.jsonl", '{"earlier": "scores"}\n')
    before = ws.files()
    env = _env(FULL_UNDER=str(ws.root / "out"))
    args = [
        "score",
        "--task",
        "sandbox_addition",
        "--predictions",
        preds,
        "--out",
        scored,
        "--force",
        "--partial",
    ]
    msg = error_message(cotgap(ws, *args, env=env, wrapper=DISK_FULL))
    assert f"{scored}: could not write (No space left on device)" in msg, msg
    assert_untouched(ws, before)


def test_disk_full_while_streaming_records(tmp_path: Path) -> None:
    """JsonlWriter (traces, predictions): a failed append is a UserError; earlier lines stay whole."""
    path = tmp_path / "cell" / "traces.jsonl"
    path.parent.mkdir()
    path.write_text('{"id": "a"}\n{"id": "b"}\n')
    code = (
        f"import sys; sys.path.insert(0, {str(FIXTURES)!r}); import disk_full\n"
        "from harness.errors import UserError\nfrom harness.store import JsonlWriter\n"
        "w = JsonlWriter(__import__('pathlib').Path(sys.argv[1]))\n"
        "try:\n    w.write({'id': 'c'})\nexcept UserError as e:\n    print(e); sys.exit(2)\n"
    )
    out = subprocess.run(
        [PY, "-c", code, str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(FULL_UNDER=str(tmp_path / "cell")),
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert f"{path}: could not write (No space left on device)" in out.stdout
    assert "re-run to resume" in out.stdout
    assert path.read_text() == '{"id": "a"}\n{"id": "b"}\n'


# --- input that looks odd but is fine ------------------------------------------------------------


def test_line_separator_inside_a_json_string_is_not_a_line_break(ws: Workspace) -> None:
    """U+2028 inside a JSON string (json.dumps(ensure_ascii=False) writes it raw) is one row."""
    tasks = ws.root / "tasks"
    tasks.mkdir()
    spec = yaml.safe_load((REPO / "tasks" / "gsm8k.yaml").read_text())
    spec.pop("sizes")
    (tasks / "gsm8k.yaml").write_text(yaml.safe_dump(spec))
    question = "Tom has 2 apples\u2028and buys 3. How many?"
    rows = [{**GSM8K_ROW, "question": question}, GSM8K_ROW]
    ws.raw("data/gsm8k/test.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    env = _env(COTGAP_TASKS_DIR=str(tasks))
    out = cotgap(ws, "ls", "items", "gsm8k", "--split", "test", "--data-dir", ws.data, env=env)
    assert out.returncode == 0, out.stderr
    items = [json.loads(line) for line in out.stdout.split("\n") if line]
    assert [it["question"] for it in items] == [question, GSM8K_ROW["question"]]
    assert [it["gold"] for it in items] == ["5", "5"]

    preds = ws.raw(
        "preds.jsonl",
        json.dumps({"id": SANDBOX_ID, "completion": "a\u2028The answer is 5."}, ensure_ascii=False)
        + "\n",
    )
    out = cotgap(ws, "score", "--task", "sandbox_addition", "--predictions", preds, "--partial")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["n_predictions"] == 1


# --- checks that need their own set-up -------------------------------------------------------------


@pytest.mark.parametrize("problem", ["duplicate_key", "no_version"])
def test_validate_checks_the_task_files(ws: Workspace, problem: str) -> None:
    """A task YAML that plan would refuse is refused by validate (with its path and lines)."""
    tasks = ws.root / "tasks"
    tasks.mkdir()
    for p in (REPO / "tasks").glob("*.yaml"):
        (tasks / p.name).write_bytes(p.read_bytes())
    path = tasks / "sandbox_addition.yaml"
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("version:"))
    if problem == "duplicate_key":
        lines.append("version: 9\n")
        needle = f"duplicate key 'version' (lines {at + 1} and {len(lines)})"
    else:
        lines.pop(at)
        needle = "version: Field required"
    path.write_text("".join(lines))
    config = ws.config()
    before = ws.files()
    env = _env(COTGAP_TASKS_DIR=str(tasks))
    msg = error_message(cotgap(ws, "validate", config, env=env))
    assert str(path) in msg and needle in msg, msg
    assert_untouched(ws, before)


def test_check_passes_intact_cells(ws: Workspace) -> None:
    unfinished = ws.results / "t" / "cells" / "traces" / ("a" * 20)
    unfinished.mkdir(parents=True)
    out = cotgap(ws, "check", ws.config())
    assert out.returncode == 0, out.stderr
    assert "1 complete cells match their manifests; 1 unfinished" in out.stdout, out.stdout


def test_analyze_removes_what_a_killed_analysis_left(ws: Workspace) -> None:
    root = ws.results / "t"
    for stale in (".analysis.tmp-999999", ".analysis.old-999999"):
        (root / stale).mkdir()
        (root / stale / "leaderboard.csv").write_text("half,written\n")
    out = cotgap(ws, "analyze", ws.config())
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in root.iterdir() if p.name not in INDEX) == ["analysis", "cells"]


# Finding 5 of issue #23. The fix belongs in scoring.score_file and the `score` command, which the
# answer-extraction work owns; these fail until it lands (strict: an XPASS says remove the mark).
def test_score_refuses_an_empty_predictions_file(ws: Workspace) -> None:
    preds = ws.raw("preds.jsonl", "\n")
    before = ws.files()
    args = ["score", "--task", "sandbox_addition", "--predictions", preds]
    msg = error_message(cotgap(ws, *args))
    assert str(preds) in msg and "no predictions" in msg, msg
    assert_untouched(ws, before)


def test_score_refuses_a_partial_file_unless_partial(ws: Workspace) -> None:
    preds = ws.jsonl("preds.jsonl", [{"id": SANDBOX_ID, "completion": "The answer is 5."}])
    before = ws.files()
    msg = error_message(cotgap(ws, "score", "--task", "sandbox_addition", "--predictions", preds))
    assert str(preds) in msg and "coverage 0.5%" in msg and "--partial" in msg, msg
    assert_untouched(ws, before)
    out = cotgap(ws, "score", "--task", "sandbox_addition", "--predictions", preds, "--partial")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["n_predictions"] == 1 and summary["missing"] == summary["n"] - 1
    assert summary["coverage"] == 1 / summary["n"]
    assert f"{summary['missing']} of {summary['n']} items have no prediction" in out.stderr
    assert "coverage: 1 of 200 items have a prediction" in out.stderr
