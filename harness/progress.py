"""Progress of a long stage, fed by events: a Rich bar on a terminal, sparse plain lines elsewhere.

    with StageProgress("traces teacher-l") as bar:
        bar.update({"total": 800}); bar.update({"cell": "traces teacher-l x addition"})
        bar.update({"samples": 64, "tokens": 9000})

Events are the dicts a stage child sends through `harness.engines.emit` (or the training worker
builds itself): `total`, `status`, `cell`, `skipped` (work resumed from disk, not this run's),
`samples` + `tokens`, `fields` (extra text shown after the speed, e.g. the loss), and `note`
(a line always printed, e.g. a server's long Retry-After). When stderr
is not a terminal (CI logs, `make demo > log`), a line is printed when a cell starts and at most
every `PLAIN_EVERY_S` seconds, so a log still shows that work moves and how fast.

On a terminal every bar of the process is a task of one live display (`_DISPLAY`): a run's phase
bar (`PhaseBar`: the phase's cells done, with an ETA) and the bars of the jobs inside it, so bars
never draw over each other. A child process that trains (harness/stages/train_worker.py) cannot draw on that
display: `Relay` gives it a file to append its bars' events to (`FORWARD_ENV` names it) and shows
them here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PLAIN_EVERY_S = 30.0
FORWARD_ENV = "COTGAP_PROGRESS_TO"  # set in a child: append bar events there instead of drawing


def console(stderr: bool = False) -> Any:
    """A Rich console; on a log file or a pipe, 200 columns wide instead of 80, so that tables and
    paths in `make demo > log` are not cut. While the live display is up, its own console for
    stderr: what it prints goes above the bars (another console would write through them)."""
    from rich.console import Console

    shown = _DISPLAY.progress
    if stderr and shown is not None:
        return shown.console
    out = Console(stderr=stderr)
    return out if out.is_terminal else Console(stderr=stderr, width=200)


def on_terminal() -> bool:
    """Whether bars are drawn here: stderr is a terminal and this is not a forwarding child."""
    from rich.console import Console

    return not os.environ.get(FORWARD_ENV) and Console(stderr=True).is_terminal


def _columns() -> list[Any]:
    import rich.progress as rp

    return [
        rp.TextColumn("[bold]{task.description}"),
        rp.BarColumn(),
        rp.MofNCompleteColumn(),
        rp.TextColumn("{task.fields[speed]}"),
        rp.TimeRemainingColumn(),
    ]


class _Display:
    """The process's one live Rich display, up while at least one bar uses it. Transient: a bar
    goes when its work ends; what stays on the screen is the lines printed above the bars."""

    def __init__(self) -> None:
        self.progress: Any = None
        self.users = 0
        self.lock = threading.Lock()

    def acquire(self) -> Any:
        import rich.progress as rp
        from rich.console import Console

        with self.lock:
            if self.progress is None:
                self.progress = rp.Progress(
                    *_columns(), console=Console(stderr=True), transient=True
                )
                self.progress.start()
            self.users += 1
            return self.progress

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0:
                self.progress.stop()
                self.progress = None


_DISPLAY = _Display()


def live() -> bool:
    """Whether this process's live display is up (then bars, not lines, show the work)."""
    return _DISPLAY.progress is not None


class StageProgress:
    def __init__(self, description: str, enabled: bool = True, unit: str = "completions"):
        import rich.progress as rp

        self.enabled = enabled
        self.unit = unit  # what the count counts, in the plain lines of a piped log
        self.forward = os.environ.get(FORWARD_ENV) if enabled else None
        self.rich = enabled and not self.forward and on_terminal()
        self.cell: str | None = None
        self.description = description
        self.done, self.total = 0, None
        self.tokens, self.last_line = 0, 0.0
        self.start: float | None = None
        self.extra = ""
        # a bar inside a phase bar is indented under it
        self.indent = "  " if self.rich and live() else ""
        # not drawn: a bar of its own all the same, which keeps the counts callers read
        self.progress = _DISPLAY.acquire() if self.rich else rp.Progress(*_columns(), disable=True)
        self.task = self.progress.add_task(self.indent + description, total=None, speed="")
        self.closed = False

    def update(self, event: dict[str, Any]) -> None:
        if self.forward:
            _append(self.forward, {"bar": self._id(), "of": self.description, "event": event})
            return
        p, t = self.progress, self.task
        # The rate's clock starts at the first cell (the engine is up by then), else at the total.
        if "total" in event:
            if self.total is None:
                self._plain(f"{self.description}: {event['total']} {self.unit} to do", force=True)
            self.total = event["total"]
            p.update(t, total=self.total)
            self.start = self.start or time.perf_counter()
        if "status" in event:  # what a start-up is doing (converting, starting the engine)
            p.update(t, description=self.indent + event["status"])
            self._plain(f"{self.description}: {event['status']}", force=True)
        if "cell" in event:
            if self.cell is None:
                self.start = time.perf_counter()
            self.cell = event["cell"]
            p.update(t, description=self.indent + event["cell"])
            self._plain(f"{self.description}: {self.cell}", force=True)
        if "skipped" in event and self.total is not None:  # resumed work is not this run's
            self.total -= event["skipped"]
            p.update(t, total=self.total)
        if "fields" in event:
            self.extra = event["fields"]
        if "note" in event:  # a line the user must see, whatever the display
            self.note(event["note"])
        if "samples" in event:
            self.start = self.start or time.perf_counter()
            self.done += event["samples"]
            self.tokens += event.get("tokens", 0)
            speed = self.tokens / max(1e-9, time.perf_counter() - (self.start or 0.0))
            text = f"{speed:,.0f} tok/s" + (f"  {self.extra}" if self.extra else "")
            p.update(t, advance=event["samples"], speed=text)
            of = f"/{self.total}" if self.total is not None else ""
            self._plain(f"{self.description}: {self.done}{of} {self.unit} done, {text}")

    def note(self, line: str) -> None:
        """Print `line` above the bars (on a terminal) or as a line of the log."""
        if not self.enabled:
            return
        if self.rich:
            console(stderr=True).print(f"  {self.description}: {line}", markup=False)
        else:
            print(f"  {self.description}: {line}", file=sys.stderr, flush=True)

    def _plain(self, line: str, force: bool = False) -> None:
        if not self.enabled or self.rich:
            return
        now = time.perf_counter()
        if force or now - self.last_line >= PLAIN_EVERY_S:
            self.last_line = now
            print(f"  {line}", file=sys.stderr, flush=True)

    def _id(self) -> str:
        return f"{os.getpid()}:{id(self)}"

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.forward:
            _append(self.forward, {"bar": self._id(), "end": True})
        elif self.rich:
            self.progress.remove_task(self.task)
            _DISPLAY.release()


def _append(path: str, record: dict[str, Any]) -> None:
    # one write a line in append mode: a reader sees whole lines and at most one partial last one
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


class PhaseBar:
    """A run's current phase on the live display: its cells done of its cells, with an ETA. Only
    on a terminal; elsewhere the run's lines say the same, and calls do nothing."""

    def __init__(self) -> None:
        self.active = on_terminal()
        self.progress: Any = _DISPLAY.acquire() if self.active else None
        self.task: Any = None

    def start(self, description: str, total: int) -> None:
        if self.active:
            self.finish()
            self.task = self.progress.add_task(description, total=total, speed="cells")

    def set(self, done: int) -> None:
        task = self.task  # called from a thread: the phase may end (its task go) meanwhile
        if self.active and task is not None:
            with contextlib.suppress(KeyError):
                self.progress.update(task, completed=done)

    def finish(self) -> None:
        if self.active and self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None

    def close(self) -> None:
        if self.active:
            self.finish()
            self.active = False
            _DISPLAY.release()


class Relay:
    """The bars of child processes (training workers) on this process's display. Child `i` gets a
    file through its environment (`env(i)`: `FORWARD_ENV`) and appends its bars' events there; a
    thread here reads the files every `every` seconds and draws them. Off a terminal it does
    nothing, and the children print their own plain lines."""

    def __init__(self, n: int, every: float = 0.2) -> None:
        self.active = on_terminal()
        self.every = every
        self.folder = Path(tempfile.mkdtemp(prefix="cotgap-progress-")) if self.active else None
        self.paths = [self.folder / f"{i}.jsonl" for i in range(n)] if self.folder else []
        self.offsets = dict.fromkeys(self.paths, 0)
        self.bars: dict[str, StageProgress] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def env(self, i: int) -> dict[str, str]:
        return {FORWARD_ENV: str(self.paths[i])} if self.active else {}

    def output(self, i: int) -> Any:
        """Where child `i` writes stdout and stderr: a file here on a terminal (text written
        through the live display would be drawn over; `failed` shows it), else ours (None)."""
        return open(self.paths[i].with_suffix(".log"), "ab") if self.active else None

    def failed(self, i: int, lines: int = 30) -> None:
        """Show the end of child `i`'s output above the bars: it failed, and that says why."""
        log = self.paths[i].with_suffix(".log") if self.active else None
        if log is not None and log.exists():
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            for line in tail:
                print(line, file=sys.stderr)

    def __enter__(self) -> Relay:
        if self.active:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.active:
            return
        self.stopping.set()
        self.thread.join()
        self._read()
        for bar in self.bars.values():
            bar.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _loop(self) -> None:
        while not self.stopping.wait(self.every):
            self._read()

    def _read(self) -> None:
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
                f.seek(self.offsets[path])
                data = f.read()
                whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits
                self.offsets[path] += len(whole)
                for line in whole.splitlines():
                    self._show(json.loads(line))

    def _show(self, record: dict[str, Any]) -> None:
        bar = self.bars.get(record["bar"])
        if record.get("end"):
            if bar is not None:
                bar.close()
            return
        if bar is None:
            bar = self.bars[record["bar"]] = StageProgress(record["of"])
        bar.update(record["event"])
