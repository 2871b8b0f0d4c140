"""Offline by construction: an experiment whose models and task files are all on this machine runs
with every library's network access off, whatever the environment says.

    cotgap run configs/sandbox.yaml      # sandbox models and tasks: nothing is fetched

`network_needs(exp)` lists what an experiment must fetch (a hub model, a task with no data_dir files);
when it is nothing, `settle(exp)` sets the offline variables of huggingface_hub, datasets and
transformers before any of them is imported, so engines and workers (child processes) inherit
them. Usage statistics and telemetry are off for every run: nothing needs them.
"""

from __future__ import annotations

import os

from harness.config.schema import Experiment
from harness.errors import UserError
from harness.models import sources as models
from harness.tasks import suite as tasks

NO_TELEMETRY = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def network_needs(exp: Experiment) -> list[str]:
    """What the experiment reads from the network: hub models, hub-sourced task data."""
    out = [f"model {m.name} ({m.path})" for m in (*exp.teachers, *exp.students)
           if not models.source(m).on_machine]  # fmt: skip
    local_data = tasks.data_dir_or_env(exp.data_dir) is not None
    for ref in exp.tasks:
        try:
            spec = tasks.load_task(ref.name)
        except UserError:
            continue  # reported by validation
        if spec.source.sandbox is None and not local_data:
            out.append(f"task {ref.name} (no data_dir)")
    return out


def settle(exp: Experiment | None = None) -> None:
    """Telemetry off; and with `exp` needing nothing from the network, every offline switch on."""
    for name, value in NO_TELEMETRY.items():
        os.environ.setdefault(name, value)
    if exp is not None and not network_needs(exp):
        os.environ.update(OFFLINE)
