"""Progress of a long stage, fed by events: a Rich bar on a terminal, sparse plain lines elsewhere.

    with StageProgress("traces teacher-l") as bar:
        bar.update({"total": 800}); bar.update({"cell": "traces teacher-l x addition"})
        bar.update({"samples": 64, "tokens": 9000})

Events are the dicts a stage child sends through `harness.engines.emit` (or the training worker
builds itself): `total`, `status`, `cell`, `skipped` (work resumed from disk, not this run's),
`samples` + `tokens`, and `fields` (extra text shown after the speed, e.g. the loss). When stderr
is not a terminal (CI logs, `make demo > log`), a line is printed when a cell starts and at most
every `PLAIN_EVERY_S` seconds, so a log still shows that work moves and how fast.
"""

from __future__ import annotations

import sys
import time
from typing import Any

PLAIN_EVERY_S = 30.0


def console(stderr: bool = False) -> Any:
    """A Rich console; on a log file or a pipe, 200 columns wide instead of 80, so that tables and
    paths in `make demo > log` are not cut."""
    from rich.console import Console

    out = Console(stderr=stderr)
    return out if out.is_terminal else Console(stderr=stderr, width=200)


class StageProgress:
    def __init__(self, description: str, enabled: bool = True):
        import rich.progress as rp
        from rich.console import Console

        console = Console(stderr=True)
        self.enabled = enabled
        self.rich = enabled and console.is_terminal
        self.cell: str | None = None
        self.description = description
        self.done, self.total = 0, None
        self.tokens, self.start, self.last_line = 0, None, 0.0
        self.extra = ""
        self.progress = rp.Progress(
            rp.TextColumn("[bold]{task.description}"),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TextColumn("{task.fields[speed]}"),
            rp.TimeRemainingColumn(),
            console=console,
            disable=not self.rich,
        )
        self.task = self.progress.add_task(description, total=None, speed="")

    def update(self, event: dict[str, Any]) -> None:
        p, t = self.progress, self.task
        # The rate's clock starts at the first cell (the engine is up by then), else at the total.
        if "total" in event:
            if self.total is None:
                self._plain(f"{self.description}: {event['total']} to do", force=True)
            self.total = event["total"]
            p.update(t, total=self.total)
            self.start = self.start or time.perf_counter()
        if "status" in event:
            p.update(t, description=event["status"])
        if "cell" in event:
            if self.cell is None:
                self.start = time.perf_counter()
            self.cell = event["cell"]
            p.update(t, description=event["cell"])
            self._plain(f"{self.description}: {self.cell}", force=True)
        if "skipped" in event and self.total is not None:  # resumed work is not this run's
            self.total -= event["skipped"]
            p.update(t, total=self.total)
        if "fields" in event:
            self.extra = event["fields"]
        if "samples" in event:
            self.start = self.start or time.perf_counter()
            self.done += event["samples"]
            self.tokens += event.get("tokens", 0)
            speed = self.tokens / max(1e-9, time.perf_counter() - self.start)
            text = f"{speed:,.0f} tok/s" + (f"  {self.extra}" if self.extra else "")
            p.update(t, advance=event["samples"], speed=text)
            of = f"/{self.total}" if self.total is not None else ""
            self._plain(f"{self.description}: {self.done}{of} done, {text}")

    def _plain(self, line: str, force: bool = False) -> None:
        if not self.enabled or self.rich:
            return
        now = time.perf_counter()
        if force or now - self.last_line >= PLAIN_EVERY_S:
            self.last_line = now
            print(f"  {line}", file=sys.stderr, flush=True)

    def __enter__(self) -> StageProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()
