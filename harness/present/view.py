"""The results viewer: one self-contained static HTML file built from a finished analysis.

    cotgap view configs/sandbox.yaml          # or: cotgap view results/sandbox

Reads `<results>/<experiment>/analysis/` (leaderboard.csv, report.md, the SVG plots) and the cells
its rows name (eval predictions, training sets), and writes `analysis/viewer.html`: the leaderboard
(sortable, filterable), the report and its figures, and for every distilled row its test items
against the baseline (gained / lost / both right / both wrong) with the full completions and the
teacher's training traces of that item. Nothing is fetched: figures are data URIs, and per-cell
data sits in gzip+base64 JSON blocks (`<script type="application/gzip">`) that the page
decompresses (DecompressionStream) only when a row is opened, so a large grid opens fast. Each
block holds one cell, so a baseline shared by every teacher is stored once.
"""

from __future__ import annotations

import base64
import csv
import gzip
import html
import io
import json
import math
import time
from pathlib import Path
from typing import Any

import yaml

from harness.errors import UserError
from harness.store import atomic_write_text, read_json, read_jsonl
from harness.tasks import scoring
from harness.tasks.suite import load_items, read_utf8

FLIPS = ("gained", "lost", "both_right", "both_wrong")


def flip(base: bool, post: bool) -> str:
    """How one test item moved from the baseline to the distilled student."""
    if base == post:
        return "both_right" if post else "both_wrong"
    return "gained" if post else "lost"


def resolve_root(target: Path) -> tuple[Path, str | None]:
    """The results directory (`<results_dir>/<name>`) and data dir from a YAML or a directory."""
    if target.is_file():
        from harness.config.loading import load_experiment

        exp = load_experiment(target)
        return exp.root, exp.data_dir
    if (target / "analysis").is_dir() or (target / "cells").is_dir():
        return target, None
    raise UserError(
        f"{target}: neither an experiment YAML nor a results directory (one with analysis/ and "
        "cells/, e.g. results/sandbox); give one of those."
    )


def _pack(obj: Any) -> str:
    raw = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


def unpack(text: str) -> Any:
    """A block's JSON (what the page's `block()` decodes); tests read blocks with it."""
    return json.loads(gzip.decompress(base64.b64decode(text)))


class _Cells:
    """The cells one viewer reads, each once: eval records, training sets, task questions."""

    def __init__(self, root: Path, data_dir: str | None):
        self.root, self.data_dir = root, data_dir
        self.evals: dict[str, dict | None] = {}
        self.questions: dict[tuple[str, str, int | None], dict[str, str]] = {}
        self.notes: list[str] = []

    def _dir(self, kind: str, key: str) -> Path | None:
        d = self.root / "cells" / kind / key
        return d if (d / "manifest.json").exists() else None

    def eval(self, key: str) -> dict | None:
        """{task, split, limit, headline, records: {id: record}} of a complete eval cell."""
        if key in self.evals:
            return self.evals[key]
        d = self._dir("eval", key) if key else None
        if d is None:
            self.evals[key] = None
            return None
        metrics = (
            read_json(d / "metrics.json", f"delete {d} and re-run")
            if (d / "metrics.json").exists()
            else {}
        )
        records = read_jsonl(d / "predictions.jsonl")
        if scoring.rescore_due(metrics):  # as analyze scores it: today's extractor
            records = scoring.rescore_cell(d, self.data_dir)
        config = (
            yaml.safe_load((d / "config.yaml").read_text()) if (d / "config.yaml").exists() else {}
        )
        task = config.get("task", {})
        headline = metrics.get("headline", "strict")
        self.evals[key] = {
            "task": task.get("name"),
            "split": task.get("split", "test"),
            "limit": task.get("limit"),
            "headline": headline,
            "records": {str(r["id"]): r for r in records},
        }
        return self.evals[key]

    def question_texts(self, task: str, split: str, limit: int | None) -> dict[str, str]:
        """{item id: question} of a task split; empty (and noted) where the items cannot load."""
        if (task, split, limit) not in self.questions:
            try:
                items = load_items(task, split, self.data_dir, limit)
                self.questions[task, split, limit] = {it.id: it.question for it in items}
            except (UserError, OSError) as e:
                self.notes.append(f"{task} ({split}): questions not shown: {e}")
                self.questions[task, split, limit] = {}
        return self.questions[task, split, limit]

    def dataset_of(self, adapter_key: str) -> str | None:
        d = self._dir("adapter", adapter_key) if adapter_key else None
        if d is None:
            return None
        up = read_json(d / "manifest.json", f"delete {d} and re-run").get("upstream") or []
        return next((k for k in up if self._dir("dataset", k)), None)

    def training(self, dataset_key: str) -> tuple[list[dict], dict] | None:
        d = self._dir("dataset", dataset_key) if dataset_key else None
        if d is None:
            return None
        config = yaml.safe_load((d / "config.yaml").read_text())
        return read_jsonl(d / "examples.jsonl"), config


def _eval_block(ev: dict) -> dict:
    """One eval cell for the page: per item [answer, correct, completion, truncated, gold]."""
    h = ev["headline"]
    rows = {
        i: [
            r.get(h),
            bool(r.get("correct")),
            r.get("completion", ""),
            bool(r.get("truncated")),
            r.get("gold"),
        ]
        for i, r in ev["records"].items()
    }
    return {"headline": h, "items": rows}


def _training_block(
    examples: list[dict], test_questions: dict[str, str], train_questions: dict[str, str]
) -> dict:
    """The training traces of each test item: those of the same id, else of the same question
    (a test question that also sits in the train split), and the training set's size."""
    by_id: dict[str, list[str]] = {}
    for ex in examples:
        by_id.setdefault(str(ex["id"]), []).append(ex.get("completion", ""))
    by_question: dict[str, list[str]] = {}
    for i, texts in by_id.items():
        q = train_questions.get(i)
        if q is not None:
            by_question.setdefault(q.strip(), []).extend(texts)
    traces = {}
    for i, q in test_questions.items():
        found = by_id.get(i) or (by_question.get(q.strip()) if q else None)
        if found:
            traces[i] = found
    return {"n_examples": len(examples), "n_questions": len(by_id), "traces": traces}


def counts(base: dict, post: dict) -> dict[str, int]:
    """gained / lost / both_right / both_wrong over the items both evals scored."""
    out = dict.fromkeys(FLIPS, 0)
    for i, rec in post["records"].items():
        if i in base["records"]:
            out[flip(bool(base["records"][i].get("correct")), bool(rec.get("correct")))] += 1
    return out


def build(root: Path, data_dir: str | None = None) -> str:
    """The viewer's HTML for the results directory `root` (its analysis/ must exist)."""
    analysis = root / "analysis"
    board_path = analysis / "leaderboard.csv"
    if not board_path.exists():
        raise UserError(
            f"{board_path}: not found; run `cotgap analyze <config>` first (the viewer shows an "
            "analysis and the cells its rows name)."
        )
    reader = csv.reader(io.StringIO(read_utf8(board_path), newline=""))
    columns = next(reader, None)
    if columns is None:
        raise UserError(f"{board_path}: empty; run `cotgap analyze <config>` to rebuild it.")
    rows = list(reader)
    col = {c: n for n, c in enumerate(columns)}
    cells = _Cells(root, data_dir)
    blocks: dict[str, str] = {}
    teacher_eval = {
        (r[col["task"]], r[col["teacher"]]): r[col["eval_key"]]
        for r in rows
        if r[col["row_type"]] == "teacher"
    }

    def eval_block(key: str) -> str | None:
        ev = cells.eval(key)
        if ev is None:
            return None
        name = f"e-{key}"
        if name not in blocks:
            blocks[name] = _pack(_eval_block(ev))
        return name

    def questions_block(ev: dict) -> str:
        """One block per task split: every eval of it shares the question texts."""
        name = f"q-{ev['task']}-{ev['split']}-{ev['limit']}"
        if name not in blocks:
            blocks[name] = _pack(cells.question_texts(ev["task"], ev["split"], ev["limit"]))
        return name

    def training_block(dataset_key: str | None, post: dict) -> str | None:
        """One block per training set (every training seed's row of its trace draw shares it):
        its traces by test item."""
        name = f"d-{dataset_key}"
        if name in blocks:
            return name
        training = cells.training(dataset_key) if dataset_key else None
        if training is not None:
            examples, config = training
            task = config.get("task", {})
            train_qs = cells.question_texts(task.get("name"), "train", task.get("limit"))
            test_qs = cells.question_texts(post["task"], post["split"], post["limit"])
            test_qs = test_qs or dict.fromkeys(post["records"], "")
            blocks[name] = _pack(_training_block(examples, test_qs, train_qs))
        return name if training is not None else None

    distilled: dict[int, dict] = {}
    for n, r in enumerate(rows):
        if r[col["row_type"]] != "distilled":
            continue
        row: dict[str, Any] = {"task": r[col["task"]]}
        base, post = cells.eval(r[col["baseline_key"]]), cells.eval(r[col["eval_key"]])
        why_not = r[col["screened_out"]] if "screened_out" in col else ""
        if why_not:  # skipped on purpose: not a cell still to compute
            row["missing"] = f"not trained: {why_not}"
            distilled[n] = row
            continue
        if base is None or post is None:
            row["missing"] = "the baseline or distilled eval cell is not computed yet"
            distilled[n] = row
            continue
        row["counts"] = counts(base, post)
        row["base"], row["post"] = (
            eval_block(r[col["baseline_key"]]),
            eval_block(r[col["eval_key"]]),
        )
        row["questions"] = questions_block(post)
        row["teacher"] = eval_block(teacher_eval.get((r[col["task"]], r[col["teacher"]]), ""))
        row["training"] = training_block(cells.dataset_of(r[col["adapter_key"]]), post)
        distilled[n] = row

    figures = []  # each plot's SVG; its PNG where an older analysis wrote no SVG
    stems = sorted({p.stem for p in [*analysis.glob("*.svg"), *analysis.glob("*.png")]})
    for stem in stems:
        svg, png = analysis / f"{stem}.svg", analysis / f"{stem}.png"
        if svg.exists():
            blocks[f"f-{stem}"] = _pack(read_utf8(svg))
        else:
            blocks[f"f-{stem}"] = _pack(base64.b64encode(png.read_bytes()).decode("ascii"))
        figures.append({"name": stem, "block": f"f-{stem}", "svg": svg.exists()})
    answers = None
    if (analysis / "answers.csv").exists():
        with open(analysis / "answers.csv", newline="", encoding="utf-8") as f:
            table = list(csv.reader(f))
        answers = {"columns": table[0], "rows": [[_cell_value(v) for v in r] for r in table[1:]],
                   "legend": _legend(table[0])}  # fmt: skip
    report = analysis / "report.md"
    if report.exists():
        blocks["report"] = _pack(read_utf8(report))
    studies = _studies(analysis / "analysis.json")
    warnings = _warnings(analysis / "analysis.json")

    index = {
        "title": root.name,
        "root": str(root),
        "built": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "columns": columns,
        "rows": [[_cell_value(v) for v in r] for r in rows],
        "answers": answers,
        "warnings": warnings,
        "studies": studies,
        "distilled": {str(k): v for k, v in distilled.items()},
        "figures": figures,
        "report": "report" if "report" in blocks else None,
        "notes": cells.notes,
    }
    scripts = "\n".join(
        f'<script type="application/gzip" id="b-{html.escape(k)}">{v}</script>'
        for k, v in blocks.items()
    )
    # no `<` at all inside the script element: `</script>` would end it, `<!--` would start a
    # comment state that swallows the rest of the page
    index_json = json.dumps(index, ensure_ascii=False).replace("<", "\\u003c")
    head, rest = _TEMPLATE.replace("__TITLE__", html.escape(root.name)).split("__INDEX__")
    middle, tail = rest.split("__BLOCKS__")
    return head + index_json + middle + scripts + tail


def _studies(path: Path) -> dict[str, Any]:
    """The study analyses of analysis.json as the page shows them: title, question, readings and
    tables (harness/analysis/studies.py); empty for an analysis without them."""
    if not path.exists():
        return {}
    from harness.analysis import report

    result = read_json(path, "re-run `cotgap analyze <config>`")
    studies = result.get("studies") or {}
    keep = ("title", "about", "readings", "tables")
    out = {name: {k: s[k] for k in keep} for name, s in studies.items()}
    gap = report.capacity_gap_readings(result) if result.get("overall") else []
    if gap:  # the report's teacher-level capacity-gap test, with its 'too few'
        out["capacity_gap_test"] = {"title": "Capacity gap (teacher-level test)",
                                    "about": report.CAPACITY_GAP_ABOUT,
                                    "readings": [g.replace("**", "") for g in gap],
                                    "tables": []}  # fmt: skip
    return out


# the words a reader acts on, and the teacher the row quotes without recommending it
LEGEND = ("answer", "distill", "action", "quoted_teacher", "verdict", "exploratory")


def _legend(columns: list[str]) -> list[list[str]]:
    """What each word of the answers table means: answers.csv's own column definitions."""
    from harness.analysis.analyze import ANSWER_COLUMNS

    return [[c, ANSWER_COLUMNS[c]] for c in LEGEND if c in columns and c in ANSWER_COLUMNS]


def _warnings(path: Path) -> list[str]:
    """The analysis's warnings (cells that give nothing usable), as `cotgap run` prints them."""
    if not path.exists():
        return []
    return list(read_json(path, "re-run `cotgap analyze <config>`").get("warnings") or [])


def _cell_value(v: str) -> Any:
    """CSV text to what the page sorts by: numbers as numbers, empty as null."""
    if v in ("", "nan", "NaN"):
        return None
    try:
        x = float(v)
    except ValueError:
        return v
    return x if math.isfinite(x) else None


def write(target: Path, out: Path | None = None, data_dir: Path | None = None) -> Path:
    """Write the viewer (default `<results>/<experiment>/analysis/viewer.html`); returns its path.
    `data_dir` (else the config's) is where questions of file-sourced tasks are read."""
    root, config_data_dir = resolve_root(target)
    page = build(root, str(data_dir) if data_dir else config_data_dir)
    path = out or root / "analysis" / "viewer.html"
    atomic_write_text(path, page)
    return path


def embedded(page: str) -> tuple[dict, dict[str, str]]:
    """The index JSON and the raw blocks of a viewer page (for tests and tools)."""
    import re

    found = re.search(r'<script type="application/json" id="index">(.*?)</script>', page, re.S)
    assert found is not None, "the viewer page has no index"
    index = json.loads(found.group(1).replace("<\\/", "</"))
    blocks = dict(
        re.findall(r'<script type="application/gzip" id="b-([^"]+)">([^<]*)</script>', page)
    )
    return index, blocks


_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>cotgap: __TITLE__</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0 1.5em 3em;color:#222}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;font-size:12.5px}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
#board td{white-space:nowrap}
th{background:#f3f3f3;cursor:pointer;position:sticky;top:0;max-width:7em;overflow-wrap:anywhere}
dl#legend{font-size:12.5px;max-width:70em} dl#legend dt{font-weight:600;margin-top:.3em}
dl#legend dd{margin-left:1.5em} #warnings li{color:#8a4b00;max-width:70em}
tr.distilled{cursor:pointer} tr.distilled:hover{background:#eef5ff} tr.open{background:#dbeaff}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.neg{color:#b00} .pos{color:#070}
.bar{margin:.6em 0;display:flex;gap:.6em;flex-wrap:wrap;align-items:center}
button{font:inherit;padding:2px 8px;cursor:pointer} button.on{background:#246;color:#fff}
pre{white-space:pre-wrap;background:#f7f7f7;padding:6px;margin:2px 0 8px;max-height:24em;overflow:auto}
.gained{color:#070}.lost{color:#b00}.both_right{color:#555}.both_wrong{color:#999}
#figures img{max-width:48%;border:1px solid #eee;margin:2px}
.wrap{max-height:60vh;overflow:auto} .note{color:#666}
</style></head><body>
<h1>cotgap: __TITLE__</h1>
<p class="note" id="meta"></p>
<h2>Answers</h2>
<div class="wrap"><table id="answers"><thead></thead><tbody></tbody></table></div>
<p class="note">One row per (task, student, regime), from answers.csv: the teacher to distill from, none, or inconclusive, with the quoted teacher's gain and its interval over test items and replicates (points).</p>
<dl id="legend"></dl>
<h2 id="warnings-head">Warnings</h2><ul id="warnings"></ul>
<h2>Studies</h2><div id="studies"></div>
<h2>Leaderboard</h2>
<div class="bar" id="filters"></div>
<div class="wrap"><table id="board"><thead></thead><tbody></tbody></table></div>
<p class="note">Click a distilled row for its test items against the baseline.</p>
<div id="items"></div>
<h2>Figures</h2><div id="figures"></div>
<h2>Report</h2><details><summary>report.md</summary><pre id="report"></pre></details>
<script type="application/json" id="index">__INDEX__</script>
__BLOCKS__
<script>
"use strict";
const IX = JSON.parse(document.getElementById("index").textContent);
const cache = {};
async function block(name) {
  if (!(name in cache)) {
    const b64 = document.getElementById("b-" + name).textContent;  // "b-": apart from the page's ids
    const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    cache[name] = JSON.parse(await new Response(stream).text());
  }
  return cache[name];
}
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "on") for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : String(k ?? ""));
  return e;
};
const COLS = IX.columns, C = Object.fromEntries(COLS.map((c, i) => [c, i]));
const SHOW = ["row_type","task","student","teacher","regime","trace_seed","seed","teacher_acc","base_acc",
  "post_acc","gain","teacher_gain","teacher_gain_low","teacher_gain_high","verdict","in_best_set",
  "n_replicates","n_test","n_train_examples","format_fail_rate"].filter(c => c in C);
const PCT = new Set(["teacher_acc","base_acc","post_acc","gain","gain_ci_low","gain_ci_high",
  "teacher_gain","teacher_gain_low","teacher_gain_high","format_fail_rate"]);
const FILTERS = ["row_type","task","student","teacher","regime"];
const state = {sort: null, desc: false, filter: {}, open: null, flip: "all"};
function signClass(v) {  // a gain of 0 (as printed) is neither a gain nor a loss
  const r = Math.round(1000 * v);
  return r < 0 ? " neg" : r > 0 ? " pos" : "";
}
function label(c) { return c.replace(/_/g, " "); }  // headers may wrap: the board fits a window
function fmt(c, v) {
  if (v === null || v === undefined) return "";
  if (PCT.has(c) && typeof v === "number") return (100 * v).toFixed(1);
  return typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : v;
}
function filters() {
  const bar = document.getElementById("filters");
  for (const f of FILTERS) {
    const values = [...new Set(IX.rows.map(r => r[C[f]]).filter(v => v !== null))].sort();
    const sel = el("select", {id: "filter-" + f, on: {change: e => {
      state.filter[f] = e.target.value; board(); }}}, el("option", {value: ""}, f + ": all"));
    for (const v of values) sel.append(el("option", {value: v}, v));
    bar.append(sel);
  }
}
function board() {
  const thead = document.querySelector("#board thead"), tbody = document.querySelector("#board tbody");
  thead.replaceChildren(el("tr", {}, ...SHOW.map(c => el("th", {title: "sort by " + c, on: {click: () => {
    state.desc = state.sort === c ? !state.desc : false; state.sort = c; board(); }}},
    label(c) + (state.sort === c ? (state.desc ? " ▼" : " ▲") : "")))));
  let idx = IX.rows.map((r, i) => i).filter(i => FILTERS.every(f =>
    !state.filter[f] || String(IX.rows[i][C[f]]) === state.filter[f]));
  if (state.sort) {
    const k = C[state.sort], s = state.desc ? -1 : 1;
    idx.sort((a, b) => { const x = IX.rows[a][k], y = IX.rows[b][k];
      if (x === y) return 0; if (x === null) return 1; if (y === null) return -1;
      return (x < y ? -1 : 1) * s; });
  }
  tbody.replaceChildren(...idx.map(i => {
    const r = IX.rows[i], d = IX.distilled[i];
    const tr = el("tr", {"data-row": i, class: (d ? "distilled" : "") + (state.open === i ? " open" : "")},
      ...SHOW.map(c => { const v = r[C[c]];
        const cls = typeof v === "number" ? "num" + (c === "gain" ? signClass(v) : "") : "";
        return el("td", {class: cls}, fmt(c, v)); }));
    if (d) tr.addEventListener("click", () => openRow(i));
    return tr;
  }));
}
async function openRow(i, flip) {
  state.open = i; state.flip = flip || "all"; board();
  const box = document.getElementById("items"), d = IX.distilled[i], r = IX.rows[i];
  const draw = C.trace_seed === undefined ? "" : ` · trace seed ${r[C.trace_seed]}`;
  const title = `${r[C.task]} · ${r[C.student]} ← ${r[C.teacher]} · ${r[C.regime]}${draw}` +
    ` · seed ${r[C.seed]}`;
  if (d.missing) { box.replaceChildren(el("h2", {}, title), el("p", {}, d.missing)); return; }
  box.replaceChildren(el("h2", {}, title), el("p", {class: "note"}, "loading…"));
  const [base, post] = [await block(d.base), await block(d.post)];
  const teacher = d.teacher ? await block(d.teacher) : null;
  const training = d.training ? await block(d.training) : null;
  const questions = await block(d.questions);
  const items = Object.keys(post.items).filter(id => id in base.items).map(id => {
    const b = base.items[id], p = post.items[id];
    const f = b[1] === p[1] ? (p[1] ? "both_right" : "both_wrong") : (p[1] ? "gained" : "lost");
    return {id, b, p, f, q: questions[id]};
  });
  renderItems(i, title, items, teacher, training);
}
function renderItems(i, title, items, teacher, training) {
  const box = document.getElementById("items"), d = IX.distilled[i];
  const bar = el("div", {class: "bar", id: "flip-bar"});
  for (const f of ["all", "gained", "lost", "both_right", "both_wrong"]) {
    const n = f === "all" ? items.length : d.counts[f];
    bar.append(el("button", {id: "flip-" + f, class: state.flip === f ? "on" : "",
      on: {click: () => { state.flip = f; renderItems(i, title, items, teacher, training); }}},
      `${f.replace("_", " ")} (${n})`));
  }
  const shown = items.filter(it => state.flip === "all" || it.f === state.flip);
  const tbody = el("tbody", {});
  for (const it of shown) {
    const tr = el("tr", {class: "item " + it.f, "data-id": it.id, style: "cursor:pointer"},
      el("td", {}, it.id), el("td", {}, it.q ?? "(question not loaded)"), el("td", {}, it.b[4] ?? it.p[4]),
      el("td", {}, (it.b[1] ? "✓ " : "✗ ") + (it.b[0] ?? "none")),
      el("td", {}, (it.p[1] ? "✓ " : "✗ ") + (it.p[0] ?? "none")),
      el("td", {class: it.f}, it.f.replace("_", " ")));
    tr.addEventListener("click", () => {
      const next = tr.nextSibling;
      if (next && next.classList.contains("detail")) { next.remove(); return; }
      const traces = training && training.traces[it.id];
      const t = teacher && teacher.items[it.id];
      const cell = el("td", {colspan: 6},
        el("b", {}, "baseline completion" + (it.b[3] ? " (truncated)" : "")), el("pre", {}, it.b[2]),
        el("b", {}, "distilled completion" + (it.p[3] ? " (truncated)" : "")), el("pre", {}, it.p[2]),
        el("b", {}, "teacher's training traces for this item"),
        traces ? el("div", {}, ...traces.map(x => el("pre", {}, x)))
          : el("p", {class: "note"}, training
            ? `not in the training set (${training.n_questions} train questions, ${training.n_examples} examples; a test item is in it only when its id or question is)`
            : "training set not available"),
        t ? el("b", {}, `teacher's own test completion (${t[1] ? "right" : "wrong"}: ${t[0] ?? "none"})`) : "",
        t ? el("pre", {}, t[2]) : "");
      tr.after(el("tr", {class: "detail"}, cell));
    });
    tbody.append(tr);
  }
  const head = el("thead", {}, el("tr", {}, ...["id","question","gold","baseline","distilled","flip"].map(h => el("th", {}, h))));
  box.replaceChildren(el("h2", {}, title), bar,
    el("p", {class: "note"}, el("span", {id: "item-count"}, shown.length), " items shown; click one for its completions and the teacher's traces"),
    el("div", {class: "wrap"}, el("table", {id: "item-table"}, head, tbody)));
}
async function figures() {
  const box = document.getElementById("figures");
  for (const f of IX.figures) {
    const data = await block(f.block);
    box.append(el("img", {alt: f.name, title: f.name, src: f.svg
      ? "data:image/svg+xml;charset=utf-8," + encodeURIComponent(data)
      : "data:image/png;base64," + data}));
  }
  if (IX.report) document.getElementById("report").textContent = await block(IX.report);
}
document.getElementById("meta").textContent =
  `${IX.root} · built ${IX.built} · ${IX.rows.length} leaderboard rows` +
  (IX.notes.length ? " · " + IX.notes.join("; ") : "");
function answers() {
  const t = document.getElementById("answers"), A = IX.answers;
  if (!A) { t.replaceWith(el("p", {class: "note"}, "No answers.csv (an older analysis).")); return; }
  const show = ["task","student","regime","base_acc","answer","distill","action","quoted_teacher","gain","gain_low","gain_high","clears_effect","best_set","n_replicates"]
    .filter(c => A.columns.includes(c));
  const ix = Object.fromEntries(A.columns.map((c, i) => [c, i]));
  t.tHead.append(el("tr", {}, ...show.map(c => el("th", {}, label(c)))));
  for (const r of A.rows)
    t.tBodies[0].append(el("tr", {}, ...show.map(c => el("td", {},
      ["base_acc","gain","gain_low","gain_high"].includes(c) && typeof r[ix[c]] === "number"
        ? r[ix[c]].toFixed(1) : r[ix[c]]))));
  document.getElementById("legend").append(...(A.legend || []).flatMap(([c, d]) =>
    [el("dt", {}, c), el("dd", {}, d)]));
}
function warnings() {
  const W = IX.warnings || [];
  if (!W.length) { document.getElementById("warnings-head").remove(); document.getElementById("warnings").remove(); return; }
  document.getElementById("warnings").append(...W.map(w => el("li", {}, w)));
}
function studies() {
  const box = document.getElementById("studies"), S = IX.studies || {};
  if (!Object.keys(S).length) { box.append(el("p", {class: "note"}, "No studies (an older analysis).")); return; }
  for (const s of Object.values(S)) {
    const d = el("details", {}, el("summary", {}, s.title), el("p", {class: "note"}, s.about),
      el("ul", {}, ...s.readings.map(r => el("li", {}, r))));
    for (const t of s.tables) {
      if (!t.rows.length) continue;
      const head = el("thead", {}, el("tr", {}, ...t.columns.map(c => el("th", {}, c))));
      const body = el("tbody", {}, ...t.rows.map(r => el("tr", {}, ...r.map(v => el("td", {},
        typeof v === "number" && !Number.isInteger(v) ? v.toFixed(1) : v)))));
      d.append(el("p", {}, t.title), el("div", {class: "wrap"}, el("table", {}, head, body)));
    }
    box.append(d);
  }
}
answers(); warnings(); studies(); filters(); board(); figures();
if (typeof DecompressionStream === "undefined")
  document.getElementById("items").textContent = "This browser cannot decompress the embedded data (no DecompressionStream); open the file in a current Chrome, Firefox or Safari.";
</script></body></html>
"""
