"""Run by tests/test_distributed.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU).

The same 16 completions as tests/test_trainer.py's invariance test, now split over 2 processes x (batch 4,
accumulation 2). Checks that the step's silenced set is the single-process Eq. 6 set of the 16, that the
process-averaged gradient equals the Eq. 6 gradient, that the logged entropy quantiles and Table 1 are those of all 16
completions' loss tokens, and that scope "micro_batch" gives another gradient; then the same where one process holds no
positive-advantage completion (both run the same number of pre-pass forwards). Then two real training steps.
"""

import math
import sys
import tempfile

import torch
import torch.distributed as dist
from conftest import cpu_config, length_reward
from datasets import Dataset
from eq6 import s2t_silenced, token_logps_and_entropies
from test_quadrants import reference_table, reference_tokens
from test_trainer import TEST_TAU_P, eq6_reference, grads_differ, make_inputs, split_rows, step_gradient

from stapo_trl import STAPOTrainer
from stapo_trl.s2t import spurious_token_mask
from stapo_trl.toy.model import tiny_qwen3
from stapo_trl.toy.tokenizer import build_tokenizer


def mean_over_processes(grads, world):
    for grad in grads.values():
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        grad /= world
    return grads


def main():
    tokenizer = build_tokenizer()
    prompts = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What is {a}+1?"}] for a in range(16)]})
    output_dir = tempfile.mkdtemp()
    trainer = STAPOTrainer(
        model=tiny_qwen3(tokenizer, seed=0),
        reward_funcs=length_reward,
        args=cpu_config(
            output_dir, spurious_prob_threshold=TEST_TAU_P, max_steps=2, learning_rate=1e-2,
            per_device_train_batch_size=4, gradient_accumulation_steps=2, spurious_mechanism_metrics=True,
        ),
        train_dataset=prompts,
        processing_class=tokenizer,
    )  # fmt: skip
    accelerator = trainer.accelerator
    rank, world = accelerator.process_index, accelerator.num_processes
    assert world == 2, f"expected 2 processes, got {world}"

    full = make_inputs(len(tokenizer), batch=16, seed=8)  # num_items_in_batch: all 16, as TRL gathers it
    rows = slice(rank * 8, rank * 8 + 8)
    local = {key: value[rows] if value.dim() else value for key, value in full.items()}

    # 1. The pure mask with `gather`: each process's mask equals its rows of the single-process mask of the batch.
    reference_model = tiny_qwen3(tokenizer, seed=0)
    with torch.no_grad():
        logps, entropies = token_logps_and_entropies(reference_model, full)
    whole = s2t_silenced(logps, entropies, full["advantages"], full["completion_mask"], TEST_TAU_P, 0.75)
    kwargs = dict(prob_threshold=TEST_TAU_P, entropy_quantile=0.75)
    mine = spurious_token_mask(
        logps[rows], entropies[rows], local["advantages"], local["completion_mask"],
        gather=trainer._gather_entropies, **kwargs,
    )  # fmt: skip
    assert torch.equal(mine, whole[rows]), f"rank {rank}: mask differs from the single-process mask"
    alone = spurious_token_mask(logps[rows], entropies[rows], local["advantages"], local["completion_mask"], **kwargs)
    differs = torch.tensor(float(not torch.equal(alone, whole[rows])))
    assert accelerator.reduce(differs, reduction="sum").item() > 0, "pooling changed nothing: pick another batch"

    # 2. Scope "step", 2 micro-batches per process: the Eq. 6 silenced set and gradient of the 16 completions.
    expected, reference_silenced = eq6_reference(tokenizer, full)
    assert torch.equal(reference_silenced, whole)
    grads, silenced = step_gradient(trainer, split_rows(local, [4, 4]))
    assert torch.equal(torch.cat(silenced), whole[rows]), f"rank {rank}: step decision differs from Eq. 6"
    grads = mean_over_processes(grads, world)  # what DDP applies
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)
    metrics = trainer._metrics["train"]
    assert metrics["spurious/silenced_count"] == [whole.sum().item()], metrics["spurious/silenced_count"]
    loss_entropies = entropies[full["completion_mask"].bool()]
    for name, q in (("p50", 0.5), ("p80", 0.8), ("p95", 0.95)):  # over both processes' values
        expected_quantile = torch.quantile(loss_entropies, q).item()
        assert abs(metrics[f"entropy/{name}"][-1] - expected_quantile) <= 1e-5 * expected_quantile, name

    # Table 1 of the step: that of the 16 completions, computed by hand on one process.
    tokens = reference_tokens(tiny_qwen3(tokenizer, seed=0), full)
    for name, value in reference_table(tokens, whole[tokens["selected"]], prob_threshold=TEST_TAU_P).items():
        logged = metrics[f"mechanism/{name}"]
        assert len(logged) == 1, (name, logged)
        same = math.isclose(logged[0], value, rel_tol=1e-4, abs_tol=1e-7)
        assert same or (math.isnan(value) and math.isnan(logged[0])), (rank, name, logged, value)

    # 3. Scope "micro_batch": each micro-batch decides alone (over both processes): another gradient.
    trainer.args.spurious_mask_scope = "micro_batch"
    grads, _ = step_gradient(trainer, split_rows(local, [4, 4]))
    grads = mean_over_processes(grads, world)
    assert grads_differ(grads, expected), "scope micro_batch gave the step's gradient: the check above is vacuous"
    trainer.args.spurious_mask_scope = "step"

    # 4. Rank 1 holds no positive-advantage completion: its pre-pass has nothing to forward, yet it runs as many
    # forwards as rank 0 (under FSDP each forward is a collective: a missing one hangs), and the decision is Eq. 6's.
    positive = torch.arange(16) < 8
    full["advantages"] = torch.where(positive, full["advantages"].abs() + 0.1, -full["advantages"].abs())
    local = {key: value[rows] if value.dim() else value for key, value in full.items()}
    expected, reference_silenced = eq6_reference(tokenizer, full)
    assert reference_silenced.any()
    forward_rows = []
    hook = trainer.model.register_forward_pre_hook(
        lambda module, args, kwargs: forward_rows.append(kwargs["input_ids"].size(0)), with_kwargs=True
    )
    decided = trainer._decide_step(split_rows(local, [4, 4]))
    hook.remove()
    counts = accelerator.gather(torch.tensor([len(forward_rows)]))
    assert counts[0] == counts[1] == 2, f"rank {rank}: forwards per process {counts.tolist()}"
    assert forward_rows == ([4, 4] if rank == 0 else [1, 1]), f"rank {rank}: rows forwarded {forward_rows}"
    silenced = torch.cat([mb["spurious_silenced"] for mb in decided])
    assert torch.equal(silenced, reference_silenced[rows]), f"rank {rank}: step decision differs from Eq. 6"
    grads, _ = step_gradient(trainer, split_rows(local, [4, 4]))
    grads = mean_over_processes(grads, world)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)

    # 5. Real training steps: the collectives line up across processes.
    trainer.train()
    assert any("spurious/silenced_ratio" in entry for entry in trainer.state.log_history)
    print(f"rank {rank}: distributed S2T OK", flush=True)


if __name__ == "__main__":
    sys.exit(main())
