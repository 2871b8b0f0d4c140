"""Stage progress: a log (stderr not a terminal) still shows each cell and, sparsely, the rate."""

from __future__ import annotations

from harness import progress
from harness.progress import StageProgress


def test_plain_lines_name_cells_and_are_throttled(capsys, monkeypatch):
    clock = iter(float(t) for t in range(0, 1000, 5))  # every perf_counter call: 5 s later
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    with StageProgress("generate t-large") as bar:  # pytest's stderr is not a terminal
        bar.update({"total": 100})
        bar.update({"cell": "traces t-large x addition"})
        for _ in range(20):
            bar.update({"samples": 5, "tokens": 500})
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == [
        "  generate t-large: 100 completions to do",  # says what it counts
        "  generate t-large: traces t-large x addition",
    ]
    rates = lines[2:]
    # 20 updates 5-10 s apart, at most one line per 30 s: far fewer lines than updates
    assert 1 <= len(rates) <= 8, rates
    assert rates[-1].startswith("  generate t-large: ") and "/100 completions done" in rates[-1]
    assert "tok/s" in rates[-1]


def test_a_note_is_always_printed_however_throttled_the_rate_lines(capsys):
    with StageProgress("generate served") as bar:
        bar.update({"cell": "traces served x addition"})
        bar.update({"samples": 1, "tokens": 10})  # throttled: no line
        bar.update({"note": "the server asks to wait 120 s"})
        bar.update({"note": "the server asks to wait 300 s"})
    lines = capsys.readouterr().err.splitlines()
    assert lines[1:] == [
        "  generate served: the server asks to wait 120 s",
        "  generate served: the server asks to wait 300 s",
    ]


def test_resumed_work_shrinks_the_total_and_disabled_prints_nothing(capsys):
    with StageProgress("evaluate s", enabled=False) as bar:
        bar.update({"total": 50})
        bar.update({"skipped": 20})
        bar.update({"cell": "eval s"})
        bar.update({"samples": 3, "tokens": 30})
    assert bar.total == 30 and bar.done == 3 and bar.cell == "eval s"
    assert capsys.readouterr().err == ""


def test_bar_follows_events():
    with StageProgress("traces t", enabled=False) as bar:
        for event in [{"total": 10}, {"status": "starting"}, {"cell": "traces:t/x"}, {"skipped": 4},
                      {"samples": 3, "tokens": 30}, {"samples": 3, "tokens": 30}]:  # fmt: skip
            bar.update(event)
    task = bar.progress.tasks[0]
    assert (task.total, task.completed, bar.cell, bar.tokens) == (6, 6, "traces:t/x", 60)


def test_a_child_process_bar_is_drawn_by_the_parent_through_the_relay(monkeypatch, capsys):
    """A training worker cannot draw on cotgap's display: on a terminal (made to think so here)
    the Relay names a file in the child's environment, the child's StageProgress appends its events
    there and prints nothing itself, and the parent's bar for it follows them to the end. A child's
    own output goes to a file instead of through the bars, and a failed child's is shown. Real
    child processes; the folder of files is gone afterwards."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    code = (
        "from harness.progress import StageProgress\n"
        "with StageProgress('train stu/t-a') as bar:\n"
        "    bar.update({'total': 5})\n"
        "    for step in range(5):\n"
        "        bar.update({'fields': f'loss {1 / (step + 1):.3f}', 'samples': 1, 'tokens': 10})\n"
    )
    fails = "import sys; print('warming up'); sys.exit('error: the reason it stopped')"
    repo = Path(__file__).resolve().parents[2]
    with progress.Relay(2, every=0.01) as relay:
        env = {**os.environ, **relay.env(0)}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=repo, capture_output=True, text=True
        )
        with relay.output(1) as out:  # a worker's own output goes to a file, not through the bars
            failed = subprocess.run([sys.executable, "-c", fails], stdout=out, stderr=out)
        capsys.readouterr()
        relay.failed(1)  # ... and a failed worker's output is shown, above the bars
        shown = capsys.readouterr().err.splitlines()
        folder = relay.folder
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert failed.returncode == 1 and shown == ["warming up", "error: the reason it stopped"]
    [bar] = relay.bars.values()
    assert (bar.description, bar.total, bar.done, bar.tokens) == ("train stu/t-a", 5, 5, 50)
    assert bar.extra == "loss 0.200" and bar.closed
    assert not folder.exists() and not progress.live()


def test_a_start_up_says_what_it_does_in_a_log(capsys):
    """Converting a GGUF model and starting the engine take tens of seconds before the first
    completion: each status is a line of its own in a piped log."""
    with StageProgress("evaluate smol") as bar:  # pytest's stderr is not a terminal
        bar.update({"total": 14})
        bar.update({"status": "converting gguf:x to float32 safetensors"})
        bar.update({"status": "starting the vllm engine"})
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "  evaluate smol: 14 completions to do",
        "  evaluate smol: converting gguf:x to float32 safetensors",
        "  evaluate smol: starting the vllm engine",
    ]
