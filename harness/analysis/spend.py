"""What a grid's results cost, as measured: the leaderboard's cost columns and the report's section.

    cotgap analyze configs/sandbox.yaml     (leaderboard.csv: gen_cost, total_cost, gain_per_cost)

A teacher's generation is priced from its traces cells: a served model's prompt and completion
tokens (the server's usage records) at its `costs.prices` entry, an in-process engine's
device-seconds (the wall time of its engine calls x the devices it held) at `costs.device_hour`.
A distilled row's total is the generation of the trace draw it trained on plus its training's
device time; evaluation is left out (every teacher's students are evaluated alike). Without a
price, the tokens and device-seconds are still shown and the money columns stay empty.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from harness.config.schema import Experiment
from harness.store import Store

COLUMNS: dict[str, str] = {
    "gen_prompt_tokens": "prompt tokens the teacher's traces used (served teachers: the server's "
    "usage records; teacher rows: every trace draw, distilled rows: the row's own draw)",
    "gen_completion_tokens": "completion tokens of those traces (as gen_prompt_tokens)",
    "gen_device_s": "device-seconds of generating those traces in-process (0 for a served teacher; "
    "shown when costs.device_hour is set)",
    "gen_retries": "retried requests of a served teacher's traces (429s, 5xx, timeouts, dropped "
    "connections, malformed answers)",
    "gen_cost": "what those traces cost: tokens at costs.prices, device time at costs.device_hour "
    "(empty without the price it needs)",
    "train_device_s": "device-seconds of the row's training run (distilled rows; shown when "
    "costs.device_hour is set)",
    "total_cost": "gen_cost of the row's trace draw + its training at costs.device_hour "
    "(distilled rows)",
    "gain_per_cost": "gain / total_cost: the gain (a fraction, as gain) per unit of cost "
    "(distilled rows)",
}


def traces_cost(exp: Experiment, store: Store, teacher: str, key: str | None) -> dict[str, Any]:
    """The cost columns of one traces cell (NaN where the cell is not complete)."""
    summary = _summary(store, "traces", key)
    if summary is None:
        return dict.fromkeys(("gen_prompt_tokens", "gen_completion_tokens", "gen_device_s",
                              "gen_retries", "gen_cost"), math.nan)  # fmt: skip
    usage = summary.get("usage") or {}
    spec = exp.model(teacher)
    device_s = (
        0.0
        if spec.served
        else _timed(exp, summary.get("generation_s", 0.0) * _devices(exp, teacher))
    )
    prompt = usage.get("prompt_tokens", 0)
    completion = usage.get("completion_tokens", summary.get("generated_tokens", 0))
    if not spec.served and key is not None:  # the engine's own count: the records' prompts
        prompt = _prompt_tokens(store, key)
    return {
        "gen_prompt_tokens": prompt,
        "gen_completion_tokens": completion,
        "gen_device_s": device_s,
        "gen_retries": usage.get("retries", 0),
        "gen_cost": _money(exp, teacher, prompt, completion, device_s),
    }


def _money(exp: Experiment, model: str, prompt: int, completion: int, device_s: float) -> float:
    spec, price, rate = exp.model(model), exp.price(model), exp.costs.device_hour
    if spec.served:
        if price is None:
            return math.nan
        return (prompt * price.input_per_million + completion * price.output_per_million) / 1e6
    return math.nan if rate is None else device_s / 3600 * rate


def add_columns(exp: Experiment, store: Store, grid: Any, board: pd.DataFrame) -> None:
    """Fill the cost columns of `board` (teacher and distilled rows) in place."""
    for i, row in board.iterrows():
        if row["row_type"] == "teacher":
            keys = [c.key for (t, name, _), c in grid.traces.items()
                    if (t, name) == (row["task"], row["teacher"])]  # fmt: skip
            parts = [traces_cost(exp, store, row["teacher"], k) for k in keys]
            _set(board, i, {c: sum(p[c] for p in parts) for c in parts[0]} if parts else {})
        elif row["row_type"] == "distilled" and isinstance(row.get("traces_key"), str):
            gen = traces_cost(exp, store, row["teacher"], row["traces_key"])
            train_s = _train_device_s(exp, store, row)
            rate = exp.costs.device_hour
            train_cost = math.nan if rate is None else train_s / 3600 * rate
            total = gen["gen_cost"] + train_cost
            gain = row.get("gain")
            per = gain / total if total and not math.isnan(total) and gain == gain else math.nan
            _set(board, i, {**gen, "train_device_s": train_s, "total_cost": total,
                            "gain_per_cost": per})  # fmt: skip


def _set(board: pd.DataFrame, i: Any, values: dict[str, Any]) -> None:
    for col, value in values.items():
        board.loc[i, col] = value


def _train_device_s(exp: Experiment, store: Store, row: Any) -> float:
    summary = _summary(store, "adapter", row.get("adapter_key"))
    if summary is None or summary.get("wall_s") is None:
        return math.nan
    return _timed(exp, float(summary["wall_s"]) * _devices(exp, row["student"]))


def _timed(exp: Experiment, seconds: float) -> float:
    """Device-seconds enter the leaderboard only when `costs.device_hour` prices them: they are
    measured times, and without a rate the leaderboard stays a function of the cells' results
    alone (a resumed run writes the same bytes as an uninterrupted one)."""
    return seconds if exp.costs.device_hour is not None else math.nan


def _devices(exp: Experiment, model: str) -> float:
    """The devices a model's engine or training holds: its resources.gpus, else its parallel
    size; at least one (a CPU run counts its machine as one device)."""
    spec = exp.model(model)
    if spec.served:
        return 0.0
    e = spec.engine
    gpus = spec.resources.gpus or e.tensor_parallel_size * e.pipeline_parallel_size
    return max(1.0, float(gpus))


def _summary(store: Store, kind: str, key: Any) -> dict[str, Any] | None:
    if not isinstance(key, str):
        return None
    manifest = store.manifest(kind, key)
    return None if manifest is None else manifest.get("summary", {})


def _prompt_tokens(store: Store, key: str) -> int:
    from harness.store import read_jsonl
    from harness.tasks.scoring import TRACES

    seen: dict[str, int] = {}
    for r in read_jsonl(store.cell_dir("traces", key) / TRACES):
        seen.setdefault(r["id"], r.get("prompt_tokens") or 0)
    return sum(seen.values())


def section(board: pd.DataFrame) -> str:
    """The report's cost section: each teacher's generation, and per teacher the mean total cost
    and gain per unit of cost of its distilled rows. Empty when no cost was measured."""
    if "gen_cost" not in board or board["gen_completion_tokens"].isna().all():
        return ""
    teachers = board[board["row_type"] == "teacher"]
    distilled = board[board["row_type"] == "distilled"]
    rows = []
    for _, t in teachers.iterrows():
        mine = distilled[(distilled["task"] == t["task"]) & (distilled["teacher"] == t["teacher"])]
        rows.append([
            t["task"], t["teacher"], _n(t["gen_prompt_tokens"]), _n(t["gen_completion_tokens"]),
            _f(t["gen_device_s"], 1), _n(t["gen_retries"]), _f(t["gen_cost"], 4),
            _f(mine["total_cost"].mean(), 4), _f(100 * mine["gain_per_cost"].mean(), 2),
        ])  # fmt: skip
    head = ["task", "teacher", "prompt tokens", "completion tokens", "device-s", "retries",
            "generation cost", "mean total cost (distilled)", "gain points per unit cost"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    note = (
        "Generation: every trace draw of the teacher; a distilled row's total adds its own draw's "
        "generation and its training. Costs are in the currency of `costs.prices` / "
        "`costs.device_hour`; a dash where no price is given."
    )
    return "## Cost\n\n" + note + "\n\n" + "\n".join(lines)


def _n(x: Any) -> str:
    return "-" if x is None or x != x else f"{int(x):,}"


def _f(x: Any, digits: int) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"
