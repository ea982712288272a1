"""Test-only: FSDP on CPU processes (gloo), which accelerate does not offer. Never part of the package.

accelerate switches FSDP on only for multi-device types (MULTI_GPU, XPU, NPU, ...): under `accelerate launch` with an
FSDP config on CPU processes, `AcceleratorState` stays MULTI_CPU and transformers' Trainer then wraps the model in
DDP. PyTorch's FSDP2 (`fully_shard`) itself runs on CPU tensors with gloo. Python imports this module at the start of
every process whose PYTHONPATH holds this folder (the launcher and the processes it starts), so the switch below is
in place when the Trainer builds its accelerator: it happens as accelerate's shared `AcceleratorState` is first set up
(a singleton, set once per process), before the Trainer reads `is_fsdp_enabled` and wraps the model. Each process
prints one line when `Accelerator.prepare` returns an FSDP module, which the tests look for.
"""

import os


if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    _accelerator_state_init = AcceleratorState.__init__
    _prepare = Accelerator.prepare

    def _init_with_fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs):
        first = AcceleratorState._shared_state == {}
        _accelerator_state_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        # What accelerate's multi-device branch does (state.py), done for MULTI_CPU.
        if first and self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    def _prepare_and_report(self, *args, **kwargs):
        from torch.distributed.fsdp import FSDPModule

        prepared = _prepare(self, *args, **kwargs)
        for value in prepared if isinstance(prepared, (tuple, list)) else (prepared,):
            if isinstance(value, FSDPModule):
                print(f"fsdp_on_cpu: rank {self.process_index}: {type(value).__name__} is an FSDPModule", flush=True)
        return prepared

    AcceleratorState.__init__ = _init_with_fsdp_on_cpu
    Accelerator.prepare = _prepare_and_report
