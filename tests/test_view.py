"""The viewer (`cotgap view`): a hand-made store of real sandbox items, analysed, then viewed.

    .venv/bin/pytest tests/test_view.py
Counts of lost / gained items are recomputed here from the predictions files and compared with
the page's embedded data and, in headless Chromium (installed from Debian when missing, else
skipped with the reason), with the item rows the page renders after two real clicks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis import analyze
from harness.config.schema import Experiment
from harness.errors import UserError
from harness.present import view
from harness.store import Store, read_jsonl
from harness.tasks.suite import load_items
from harness.workflow import grid as grids

REPO = Path(__file__).resolve().parents[1]
TASK, N_TEST, N_TRAIN = "sandbox_coin_flip", 16, 12
# (wins, losses) of each teacher's distilled student against the baseline
FLIPS = {"t_a": (3, 2), "t_b": (1, 4)}
BASE_RIGHT = 8  # the baseline gets the first 8 test items right


def _experiment(tmp: Path) -> Experiment:
    def spec(name: str) -> dict:
        d = tmp / "models" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps({"model_type": "llama", "name": name}))
        return {"name": name, "path": str(d), "size": 1e8}

    return Experiment.model_validate(
        {
            "name": "toy",
            "results_dir": str(tmp / "results"),
            "teachers": [spec(t) for t in FLIPS],
            "students": [spec("stu")],
            "tasks": [{"name": TASK, "train_limit": N_TRAIN, "test_limit": N_TEST}],
            "train": {"max_steps": 10, "regimes": ["per_teacher"], "seeds": [0]},
            "analysis": {"bootstrap_samples": 100, "seed": 1},
        }
    )


def _verdicts(cell, test: list) -> list[bool]:
    base = [i < BASE_RIGHT for i in range(len(test))]
    if cell.role == "baseline":
        return base
    if cell.role == "teacher":
        return [i % 2 == 0 for i in range(len(test))]
    wins, losses = FLIPS[cell.teacher]
    post = list(base)
    post[:losses] = [False] * losses
    post[BASE_RIGHT : BASE_RIGHT + wins] = [True] * wins
    return post


def _populate(exp: Experiment, store: Store) -> None:
    test, train = load_items(TASK, "test", None, N_TEST), load_items(TASK, "train", None, N_TRAIN)
    for c in grids.expand(exp):
        if store.complete(c.kind, c.key):
            continue
        with store.open_cell(c.kind, c.key, c.config, c.upstream) as cell:
            summary: dict = {}
            if c.kind == "eval":
                w = cell.jsonl("predictions.jsonl")
                verdicts = _verdicts(c, test)
                for it, ok in zip(test, verdicts, strict=True):
                    answer = it.gold if ok else ("yes" if it.gold == "no" else "no")
                    completion = f"{c.role} {c.model} on {it.id}: The answer is {answer}."
                    w.write(
                        {
                            "id": it.id,
                            "completion": completion,
                            "gold": it.gold,
                            "strict": answer,
                            "flexible": answer,
                            "correct": ok,
                            "truncated": False,
                        }
                    )
                acc = sum(verdicts) / len(verdicts)
                cell.write_json(
                    "metrics.json",
                    {
                        "n": len(test),
                        "accuracy": acc,
                        "headline": "strict",
                        "format_failure_rate": 0.0,
                        "truncation_rate": 0.0,
                    },
                )
                summary = {"accuracy": acc}
            elif c.kind == "dataset":
                w = cell.jsonl("examples.jsonl")
                # the train items, and test item 0 (as if a test question leaked into training)
                for it in [*train, test[0]]:
                    w.write(
                        {
                            "id": it.id,
                            "sample": 0,
                            "prompt": it.question,
                            "completion": f"{c.teacher} trace for {it.id}",
                            "n_tokens": 9,
                        }
                    )
                summary = {"n_examples": len(train) + 1, "train_tokens": 90}
            elif c.kind == "traces":
                w = cell.jsonl("traces.jsonl")
                for n, it in enumerate(train):
                    w.write(
                        {
                            "id": it.id,
                            "sample": 0,
                            "prompt": it.question,
                            "gold": it.gold,
                            "completion": f"{c.model} sample on {it.id}",
                            "correct": n % 2 == 0,
                            "strict": None if n % 3 else it.gold,
                            "completion_tokens": 7,
                        }
                    )
                summary = {"yield": 0.5, "n_items": N_TRAIN}
            cell.finish(summary)


@pytest.fixture(scope="module")
def viewed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Experiment, Path, dict, dict]:
    exp = _experiment(tmp_path_factory.mktemp("view"))
    store = Store(exp.root)
    _populate(exp, store)
    analyze.run(exp, store, log=lambda _: None)
    path = view.write(exp.root)
    index, blocks = view.embedded(path.read_text(encoding="utf-8"))
    return exp, path, index, blocks


def _flips_from_files(root: Path, base_key: str, post_key: str) -> dict[str, set[str]]:
    """gained / lost / ... item ids, straight from the two predictions files."""
    base = {
        r["id"]: r["correct"]
        for r in read_jsonl(root / "cells/eval" / base_key / "predictions.jsonl")
    }
    post = {
        r["id"]: r["correct"]
        for r in read_jsonl(root / "cells/eval" / post_key / "predictions.jsonl")
    }
    out: dict[str, set[str]] = {f: set() for f in view.FLIPS}
    for i, ok in post.items():
        b = base[i]
        name = (
            "lost"
            if b and not ok
            else "gained"
            if ok and not b
            else "both_right"
            if ok
            else "both_wrong"
        )
        out[name].add(i)
    return out


def test_embedded_counts_equal_the_predictions_files(viewed) -> None:
    exp, path, index, blocks = viewed
    board = pd.read_csv(exp.root / "analysis" / "leaderboard.csv")
    dist = board[board.row_type == "distilled"]
    assert len(dist) == len(FLIPS) == len(index["distilled"])
    for n, row in dist.iterrows():
        entry = index["distilled"][str(n)]
        files = _flips_from_files(exp.root, row.baseline_key, row.eval_key)
        assert {f: len(ids) for f, ids in files.items()} == entry["counts"]
        wins, losses = FLIPS[row.teacher]
        assert (entry["counts"]["gained"], entry["counts"]["lost"]) == (wins, losses)
        # what the page computes when the row is opened: the blocks, joined by item id
        base, post = view.unpack(blocks[entry["base"]]), view.unpack(blocks[entry["post"]])
        lost = {i for i, p in post["items"].items() if base["items"][i][1] and not p[1]}
        assert lost == files["lost"]
        questions = view.unpack(blocks[entry["questions"]])  # the sandbox questions load
        assert set(questions) == set(post["items"]) and all(questions.values())


def test_training_traces_are_matched_by_item(viewed) -> None:
    _, _, index, blocks = viewed
    test = load_items(TASK, "test", None, N_TEST)
    for entry in index["distilled"].values():
        training = view.unpack(blocks[entry["training"]])
        assert training["n_examples"] == N_TRAIN + 1
        assert list(training["traces"]) == [test[0].id]  # only the leaked test item
        assert training["traces"][test[0].id][0].endswith(f"trace for {test[0].id}")


def test_page_is_self_contained(viewed) -> None:
    _, path, index, _ = viewed
    page = path.read_text(encoding="utf-8")
    for needle in ('src="http', 'href="http', "<link", "<script src", "fetch(", "@import"):
        assert needle not in page
    assert index["figures"] and index["report"]  # the report's SVG plots and report.md


def test_cli_view_prints_the_path_and_rejects_a_bad_target(viewed, tmp_path: Path) -> None:
    exp, *_ = viewed
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = tmp_path / "v.html"
    cmd = [sys.executable, "-m", "harness", "view", str(exp.root), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(out)) and out.stat().st_size > 10_000
    bad = subprocess.run(
        [sys.executable, "-m", "harness", "view", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert (
        bad.returncode == 2 and "neither an experiment YAML nor a results directory" in bad.stderr
    )


def test_missing_analysis_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "cells").mkdir()
    with pytest.raises(view.UserError, match="run `cotgap analyze"):
        view.build(tmp_path)


def test_browser_clicks_to_the_lost_items(viewed, tmp_path: Path) -> None:
    from browser import Browser, find_chromium

    pytest.importorskip("websockets", reason="the CDP client needs the websockets package")
    binary, why = find_chromium()
    if binary is None:
        pytest.skip(f"no headless browser: {why}")
    exp, path, index, _ = viewed
    board = pd.read_csv(exp.root / "analysis" / "leaderboard.csv")
    row = board[(board.row_type == "distilled") & (board.teacher == "t_b")].index[0]
    expected = _flips_from_files(exp.root, board.baseline_key[row], board.eval_key[row])["lost"]
    with Browser.start(binary) as b:
        b.open(path.as_uri())
        b.wait_for("document.getElementById('report').textContent.includes('#')")  # report.md
        n_figures = len(index["figures"])
        b.wait_for(f"document.querySelectorAll('#figures img').length === {n_figures}")
        assert b.js("[...document.querySelectorAll('#figures img')].every(i => i.naturalWidth > 0)")
        b.click(f'tr.distilled[data-row="{row}"]')
        b.click("#flip-lost")
        b.wait_for("document.querySelector('#flip-lost.on') !== null")
        shown = b.js("[...document.querySelectorAll('#item-table tr.item')].map(r => r.dataset.id)")
        assert set(shown) == expected and len(shown) == len(expected) == FLIPS["t_b"][1]
        assert b.js("document.getElementById('item-count').textContent") == str(len(expected))
        first = load_items(TASK, "test", None, N_TEST)[0]
        assert shown[0] == first.id
        assert b.js(
            "document.querySelector('#item-table tr.item td:nth-child(2)').textContent"
        ) == (first.question)
        b.click("#item-table tr.item")  # the first lost item: its completions one click away
        detail = b.wait_for("document.querySelector('#item-table tr.detail')?.innerText")
        assert f"baseline stu on {shown[0]}" in detail and f"distilled stu on {shown[0]}" in detail
        assert f"t_b trace for {shown[0]}" in detail  # test item 0 sits in the training set
        b.click(f'#item-table tr.item[data-id="{shown[1]}"]')
        b.wait_for("document.querySelectorAll('#item-table tr.detail').length === 2")
        assert "not in the training set" in b.js(
            "document.querySelectorAll('#item-table tr.detail')[1].innerText"
        )
        b.screenshot(tmp_path / "viewer.png")
        if target := os.environ.get("COTGAP_VIEWER_SCREENSHOT"):
            b.screenshot(Path(target))
    assert (tmp_path / "viewer.png").stat().st_size > 10_000


def test_demo_viewer_is_under_5_mb(tmp_path: Path) -> None:
    """The `make demo` grid (results/sandbox) where it has been run here: its viewer stays small."""
    root = REPO / "results" / "sandbox"
    if not (root / "analysis" / "leaderboard.csv").exists():
        pytest.skip(f"no demo analysis at {root} (run `make demo` first)")
    path = view.write(root, tmp_path / "viewer.html")
    assert path.stat().st_size < 5_000_000


def test_an_analysis_without_svgs_shows_its_pngs(viewed, tmp_path: Path) -> None:
    import base64
    import shutil

    exp, *_ = viewed
    root = tmp_path / "toy"
    shutil.copytree(exp.root, root)
    for svg in (root / "analysis").glob("*.svg"):
        svg.unlink()
    index, blocks = view.embedded(view.build(root))
    pngs = sorted(p.stem for p in (root / "analysis").glob("*.png"))
    assert [f["name"] for f in index["figures"]] == pngs and pngs
    for f in index["figures"]:
        assert not f["svg"]
        assert base64.b64decode(view.unpack(blocks[f["block"]])).startswith(b"\x89PNG")


def test_cotgap_analyze_writes_the_viewer_and_prints_its_path(viewed) -> None:
    import yaml

    exp, path, *_ = viewed
    cfg = exp.root.parent.parent / "toy.yaml"
    cfg.write_text(yaml.safe_dump(exp.model_dump(mode="json", exclude_none=True)))
    path.unlink()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "harness", "analyze", str(cfg)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"viewer:      {path}" in done.stderr.replace("\n", "") and path.exists()


def test_a_row_whose_eval_is_not_computed_says_so(viewed, tmp_path: Path) -> None:
    import shutil

    exp, *_ = viewed
    root = tmp_path / "toy"
    shutil.copytree(exp.root, root)
    board = pd.read_csv(root / "analysis" / "leaderboard.csv")
    n = board[board.row_type == "distilled"].index[0]
    (root / "cells" / "eval" / board.eval_key[n] / "manifest.json").unlink()  # now incomplete
    index, blocks = view.embedded(view.build(root))
    assert index["distilled"][str(n)] == {
        "task": TASK,
        "missing": "the baseline or distilled eval cell is not computed yet",
    }
    assert f"e-{board.eval_key[n]}" not in blocks


def test_no_text_in_the_index_can_end_or_comment_out_its_script(viewed, tmp_path: Path) -> None:
    """`</script>` would end the index's script element and `<!--<script>` would swallow the rest
    of the page: the index holds no `<` at all, and reads back to the same text."""
    import shutil

    exp, *_ = viewed
    root = tmp_path / "toy"
    shutil.copytree(exp.root, root)
    board = pd.read_csv(root / "analysis" / "leaderboard.csv")
    nasty = "<!--<script>alert(1)</script>--></script><!--"
    board["note"] = nasty
    board.to_csv(root / "analysis" / "leaderboard.csv", index=False)
    page = view.build(root)
    script = re.search(r'<script type="application/json" id="index">(.*?)</script>', page, re.S)
    assert "<" not in script.group(1)
    index, _ = view.embedded(page)
    assert index["columns"][-1] == "note" and {r[-1] for r in index["rows"]} == {nasty}


@pytest.mark.parametrize("name", ["report.md", "leaderboard.csv"])
def test_a_file_that_is_not_utf8_is_a_user_error(viewed, tmp_path: Path, name: str) -> None:
    import shutil

    exp, *_ = viewed
    root = tmp_path / "toy"
    shutil.copytree(exp.root, root)
    path = root / "analysis" / name
    path.write_bytes(path.read_bytes()[:40] + b"\xff\xfe latin-1 \xe9\n")
    with pytest.raises(UserError, match=rf"{re.escape(str(path))}: line \d+: not UTF-8 text"):
        view.build(root)


def test_a_screened_out_row_is_reported_as_such_not_as_missing(viewed, tmp_path, monkeypatch):
    """A row top_k did not train is skipped on purpose: the analysis does not count its cells as
    "not computed yet" and the viewer says why it has no numbers. (The screen decision is
    patched in: this grid has no screens; tests/test_screen.py runs the real gate.)"""
    import shutil

    from harness.analysis import screening

    exp, *_ = viewed
    copy = exp.model_copy(update={"results_dir": str(tmp_path)})
    shutil.copytree(exp.root, copy.root)
    d = next(iter(grids.expand(copy).distilled.values()))
    why = "screened out: rsr rank 2 of 2, top 1 trained"
    monkeypatch.setattr(screening, "screened_out", lambda g, s: {d.adapter.key: why})
    for kind, key in (("adapter", d.adapter.key), ("eval", d.eval.key)):
        shutil.rmtree(copy.root / "cells" / kind / key)  # as a run that skipped them leaves it
    store = Store(copy.root)
    board, missing, _, _ = analyze.leaderboard(copy, store)
    assert missing == {}, missing
    analyze.run(copy, store, log=lambda _: None)
    index, _ = view.embedded(view.build(copy.root))
    rows = [v for v in index["distilled"].values() if "missing" in v]
    assert rows == [{"task": TASK, "missing": f"not trained: {why}"}]


def test_the_page_carries_the_answers_legend_and_the_warnings(viewed, tmp_path: Path) -> None:
    """The words of the answers table are defined on the page (answers.csv's own definitions),
    and the analysis's warnings are listed: a weak run looks weak in the viewer too."""
    exp, _, index, _ = viewed
    legend = dict(index["answers"]["legend"])
    assert set(legend) == {
        "answer",
        "distill",
        "action",
        "quoted_teacher",
        "verdict",
        "exploratory",
    }
    assert "not a recommendation" in legend["quoted_teacher"]
    assert (
        legend["action"] == analyze.ANSWER_COLUMNS["action"] and "keep_baseline" in legend["action"]
    )
    result = json.loads((exp.root / "analysis" / "analysis.json").read_text())
    assert index["warnings"] == result["warnings"]
    line = "traces:teacher/t_a/x: 0 of 12 questions have a correct trace"
    (exp.root / "analysis" / "analysis.json").write_text(json.dumps({**result, "warnings": [line]}))
    out = view.write(exp.root, tmp_path / "v.html")
    assert view.embedded(out.read_text(encoding="utf-8"))[0]["warnings"] == [line]


def test_a_gain_that_prints_as_zero_is_neither_green_nor_red(viewed) -> None:
    """The board's colour of a gain, run in node: what prints as 0.0 points has no colour."""
    import shutil

    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run the page's script")
    _, path, _, _ = viewed
    page = path.read_text(encoding="utf-8")
    fn = re.search(r"function signClass\(v\) \{.*?\n\}", page, re.S).group(0)
    values = [0.0, 0.0004, -0.0004, 0.001, -0.02]
    code = f"{fn}\nconsole.log(JSON.stringify({json.dumps(values)}.map(signClass)))"
    out = subprocess.run([node, "-e", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["", "", "", " pos", " neg"]


def test_the_page_states_the_teacher_level_capacity_gap_test(viewed) -> None:
    """The report's capacity-gap test reaches the page with its 'too few' (this grid's teachers
    cannot reach p <= 0.05 in any order), worded as the report words it."""
    exp, _, index, _ = viewed
    result = json.loads((exp.root / "analysis" / "analysis.json").read_text())
    shown = index["studies"]["capacity_gap_test"]
    report_text = (exp.root / "analysis" / "report.md").read_text(encoding="utf-8")
    assert shown["readings"], shown
    for line in shown["readings"]:
        assert "too few teachers" in line and "it needs ≥ 5 teachers" in line
        assert line in report_text.replace("**", "")
    n = len(exp.teachers)
    assert all(o["capacity_gap"]["gain~teacher_acc"]["n_teachers"] == n
               for o in result["overall"].values() if o["n_decided"])  # fmt: skip
