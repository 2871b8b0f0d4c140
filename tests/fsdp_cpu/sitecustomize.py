"""Test-only: lets accelerate shard with FSDP on a CPU, in the processes that `accelerate launch`
starts for tests/test_train.py (this folder leads their PYTHONPATH, so Python imports it at start).

accelerate 1.15 turns on FSDP only for accelerator devices: `AcceleratorState.__init__` sets
`DistributedType.FSDP` inside its branch for MULTI_GPU/XPU/NPU/..., so processes on a CPU stay
MULTI_CPU and `prepare` wraps the model in DDP, FSDP config or not. torch 2.13's FSDP2
(`fully_shard`) itself runs on CPU tensors over gloo. This module makes that one decision the
other way (MULTI_CPU with an FSDP plugin becomes FSDP); everything after it (accelerate's FSDP2
prepare, sharded save_state/load_state, get_state_dict, cotgap's hooks) runs unchanged.
"""

import os

if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
    import accelerate.state as _state
    from accelerate.utils import DistributedType as _Type

    _init = _state.AcceleratorState.__init__

    def _fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs):  # noqa: ANN001, ANN002, ANN003
        _init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == _Type.MULTI_CPU:
            self.distributed_type = _Type.FSDP
            self.fsdp_plugin = fsdp_plugin
            # later AcceleratorState() calls copy the partial state's type over ours
            _state.PartialState._shared_state["distributed_type"] = _Type.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)

    _state.AcceleratorState.__init__ = _fsdp_on_cpu
