"""Run by tests/test_distributed.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU).

Each process holds half of a fixed batch. Checks that every process silences exactly the rows of the single-process
mask of the whole batch, and that the process-averaged gradient equals the single-process Eq. 6 gradient.
"""

import sys
import tempfile

import torch
import torch.distributed as dist
from conftest import cpu_config, length_reward
from datasets import Dataset
from eq6 import s2t_silenced, stapo_loss, token_logps_and_entropies
from test_trainer import TEST_TAU_P, make_inputs

from stapo_trl import STAPOTrainer
from stapo_trl.s2t import spurious_token_mask
from stapo_trl.toy.model import tiny_qwen3
from stapo_trl.toy.tokenizer import build_tokenizer


def main():
    tokenizer = build_tokenizer()
    prompts = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What is {a}+1?"}] for a in range(16)]})
    output_dir = tempfile.mkdtemp()
    trainer = STAPOTrainer(
        model=tiny_qwen3(tokenizer, seed=0),
        reward_funcs=length_reward,
        args=cpu_config(output_dir, spurious_prob_threshold=TEST_TAU_P, max_steps=2, learning_rate=1e-2),
        train_dataset=prompts,
        processing_class=tokenizer,
    )
    accelerator = trainer.accelerator
    rank, world = accelerator.process_index, accelerator.num_processes
    assert world == 2, f"expected 2 processes, got {world}"

    full = make_inputs(len(tokenizer), seed=5)
    rows = slice(rank * 3, rank * 3 + 3)
    local = {key: value[rows] if value.dim() else value for key, value in full.items()}  # num_items stays global

    # 1. Masks: each process's mask equals its rows of the single-process mask of the whole batch.
    reference_model = tiny_qwen3(tokenizer, seed=0)
    with torch.no_grad():
        logps, entropies = token_logps_and_entropies(reference_model, full)
    whole = spurious_token_mask(
        logps, entropies, full["advantages"], full["completion_mask"], prob_threshold=TEST_TAU_P, entropy_quantile=0.75
    )
    assert torch.equal(whole, s2t_silenced(logps, entropies, full["advantages"], full["completion_mask"], TEST_TAU_P, 0.75))
    mine = spurious_token_mask(
        logps[rows],
        entropies[rows],
        local["advantages"],
        local["completion_mask"],
        prob_threshold=TEST_TAU_P,
        entropy_quantile=0.75,
        gather=trainer._gather_candidate_entropies,
    )
    assert torch.equal(mine, whole[rows]), f"rank {rank}: mask differs from the single-process mask"
    # Without pooling, this process's own quantile would differ: the check above is not vacuous.
    alone = spurious_token_mask(
        logps[rows], entropies[rows], local["advantages"], local["completion_mask"], prob_threshold=TEST_TAU_P,
        entropy_quantile=0.75,
    )
    differs = torch.tensor(float(not torch.equal(alone, whole[rows])))
    assert accelerator.reduce(differs, reduction="sum").item() > 0, "pooling changed nothing: pick another batch"

    # 2. Gradients: the mean over processes (what DDP applies) equals the single-process Eq. 6 gradient.
    model = trainer.model
    model.train()
    model.zero_grad()
    trainer.current_gradient_accumulation_steps = 1
    trainer._compute_loss(model, local).backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
        parameter.grad /= world
    loss, silenced = stapo_loss(
        reference_model, full, prob_threshold=TEST_TAU_P, entropy_quantile=0.75, epsilon_low=0.2, epsilon_high=0.28
    )
    loss.backward()
    assert silenced.any()
    for (name, parameter), reference in zip(model.named_parameters(), reference_model.parameters(), strict=True):
        torch.testing.assert_close(parameter.grad, reference.grad, rtol=1e-4, atol=1e-6, msg=name)
    logged = trainer._metrics["train"]["spurious/silenced_count"][-1]
    assert logged == silenced.sum().item(), (logged, silenced.sum().item())

    # 3. Real training steps: the collectives line up across processes.
    trainer.train()
    assert any("spurious/silenced_ratio" in entry for entry in trainer.state.log_history)
    print(f"rank {rank}: distributed S2T OK", flush=True)


if __name__ == "__main__":
    sys.exit(main())
