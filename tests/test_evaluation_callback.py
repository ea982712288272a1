"""stapo_trl.evaluation.callback under FSDP2: the in-training evaluation leaves the model sharded, as TRL's weight
sync to a colocated vLLM needs (a single-process FSDP2 model on the CPU, gloo)."""

import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from transformers import TrainerControl, TrainerState

from stapo_trl.evaluation import BenchmarkEvalCallback, reshard_fsdp_modules


fsdp = pytest.importorskip("torch.distributed.fsdp")
DTensor = pytest.importorskip("torch.distributed.tensor").DTensor


@pytest.fixture
def process_group(monkeypatch):
    with socket.socket() as probe:  # a free port: other test processes may hold the usual ones
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def sharded_toy_model():
    """The toy model wrapped as accelerate does under FSDP2: each decoder layer, then the root (embeddings, final
    norm, lm_head), whose parameters stay unsharded after a forward pass."""
    from stapo_trl.toy.model import tiny_qwen3
    from stapo_trl.toy.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model = tiny_qwen3(tokenizer, seed=0)
    for layer in model.model.layers:
        fsdp.fully_shard(layer)
    fsdp.fully_shard(model)
    return model, tokenizer


def test_a_no_grad_forward_leaves_the_root_unsharded_and_reshard_fixes_it(process_group):
    model, _ = sharded_toy_model()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))
    assert not isinstance(model.lm_head.weight, DTensor)  # what TRL's sync then calls full_tensor() on
    assert reshard_fsdp_modules(model) == 1 + len(model.model.layers)
    assert isinstance(model.lm_head.weight, DTensor) and isinstance(model.model.embed_tokens.weight, DTensor)
    assert all(isinstance(p, DTensor) for p in model.parameters())


def test_the_callback_reshards_after_generating(process_group):
    model, tokenizer = sharded_toy_model()
    callback = BenchmarkEvalCallback("AMC23", every_n_steps=1, num_samples=1, max_problems=2, batch_size=2)
    state = TrainerState()
    state.global_step = 1
    callback.on_step_end(
        SimpleNamespace(max_completion_length=4), state, TrainerControl(), model=model, processing_class=tokenizer
    )
    assert 0 <= state.log_history[0]["eval/AMC23/avg@1"] <= 100  # it did generate, on the sharded model
    assert all(isinstance(p, DTensor) for p in model.parameters())
