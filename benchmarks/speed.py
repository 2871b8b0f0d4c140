"""Speed figures of the fast paths (the tests check their work, never their wall time).

    .venv/bin/python -m benchmarks.speed            # a table: figure, best of 3 (s), median (s)

Each figure is the best and the median of three runs on this machine: CLI start-up (`--help`,
`validate` on the shipped configs), `cotgap ls tasks`, loading the shipped zoo (every file checked
against its sha256), answer extraction on 1 MB and on 10,000 adversarial characters, and the
paired bootstrap of 5,000 items.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cli(*argv: str) -> Callable[[], object]:
    return lambda: subprocess.run(
        [sys.executable, "-m", "harness", *argv], capture_output=True, cwd=REPO, check=False
    )


def _zoo() -> None:
    from harness.sandbox import zoo

    for name in zoo.ZOO:
        zoo.verify_shipped.cache_clear()
        zoo.verify_shipped(name)


def _extract(text: str) -> Callable[[], None]:
    def run() -> None:
        from harness.tasks.answers import EXTRACTORS

        for ex in EXTRACTORS.values():
            ex.read(text, ["yes", "no"] if ex.name == "choice" else None)

    return run


def _bootstrap() -> None:
    import numpy as np

    from harness.stats.adapters import paired_bootstrap

    rng = np.random.default_rng(9)
    paired_bootstrap(rng.random(5000) < 0.4, rng.random(5000) < 0.5, n_resamples=2000)


def figures() -> dict[str, Callable[[], object]]:
    configs = [str(p) for p in sorted((REPO / "configs").glob("*.yaml"))]
    adversarial = "".join(
        "0123456789{}()[]\\$/.,-: Aanswer is\n"[(i * 7919) % 35] for i in range(10_000)
    )
    return {
        "cotgap --help": _cli("--help"),
        "cotgap validate configs/*.yaml": _cli("validate", *configs),
        "cotgap ls tasks": _cli("ls", "tasks"),
        "load + verify the shipped zoo": _zoo,
        "extract 1 MB (all extractors)": _extract("The answer is 42. " * 55_556),
        "extract 10k adversarial chars": _extract(adversarial),
        "paired bootstrap, 5,000 items x 2,000": _bootstrap,
    }


def main() -> None:
    print(f"{'figure':<40} {'best (s)':>9} {'median (s)':>11}")
    for name, fn in figures().items():
        walls = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            walls.append(time.perf_counter() - start)
        print(f"{name:<40} {min(walls):>9.3f} {statistics.median(walls):>11.3f}")


if __name__ == "__main__":
    main()
