"""One STAPOTrainer run with TRL's colocated vLLM generation on the CPU, in a process of its own (tests/test_vllm.py).

    python tests/vllm_training_run.py MODEL_DIR OUTPUT_DIR IMPORTANCE_SAMPLING_MODE CLIP_MAX
    accelerate launch --multi_gpu --num_processes 2 ... tests/vllm_training_run.py MODEL_DIR OUTPUT_DIR MODE CLIP_MAX

IMPORTANCE_SAMPLING_MODE and CLIP_MAX are TRL's vllm_importance_sampling_mode and vllm_importance_sampling_clip_max.

Each process writes OUTPUT_DIR/recorded_rank<r>.pt: every training micro-batch as the loss received it, the weights
the loss was computed with and the loss it returned; process 0 also writes the log history and the final weights.
For a colocated vLLM, TRL sets RANK, WORLD_SIZE and MASTER_* in the environment for good: one run per process.
"""

import json
import sys
from pathlib import Path

import torch
import vllm_cpu_weight_sync
from datasets import Dataset

from stapo_trl import STAPOConfig, STAPOTrainer


# With a ~100-token vocabulary a random model gives most tokens probability ~0.01: τ_p = 0.02 makes candidates common.
TAU_P = 0.02
LEARNING_RATE = 1e-2  # large, so that one update moves the log-probabilities far more than vLLM's bf16 rounding does


def varied_reward(completions, **kwargs):
    """Deterministic, and different within a group of random completions, so that advantages and candidates exist."""
    return [float(sum(map(ord, completion[0]["content"])) % 3) - 1.0 for completion in completions]


class RecordingSTAPOTrainer(STAPOTrainer):
    """STAPOTrainer that keeps what each training micro-batch's loss saw: its inputs, the weights and the loss."""

    recorded: list

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        if self.model.training:
            self.recorded.append(
                {
                    "global_step": self.state.global_step,
                    "inputs": {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)},
                    "weights": {
                        k: v.detach().clone() for k, v in self.accelerator.unwrap_model(model).state_dict().items()
                    },
                    "loss": loss.detach().clone(),
                }
            )
        return loss


def main(model_dir: str, output_dir: str, importance_sampling_mode: str, clip_max: str) -> None:
    vllm_cpu_weight_sync.install()
    prompts = [[{"role": "user", "content": f"What is {a}+{a + 1}?"}] for a in range(32)]
    config = STAPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        report_to="none",
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        max_steps=3,
        learning_rate=LEARNING_RATE,
        warmup_steps=0,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        spurious_prob_threshold=TAU_P,
        spurious_trace=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=128,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=importance_sampling_mode,
        vllm_importance_sampling_clip_max=float(clip_max),
    )
    trainer = RecordingSTAPOTrainer(
        model=model_dir, reward_funcs=varied_reward, args=config, train_dataset=Dataset.from_dict({"prompt": prompts})
    )
    trainer.recorded = []
    trainer.train()
    rank = trainer.accelerator.process_index
    torch.save(trainer.recorded, Path(output_dir) / f"recorded_rank{rank}.pt")
    if trainer.accelerator.is_main_process:
        (Path(output_dir) / "log_history.json").write_text(json.dumps(trainer.state.log_history))
        final = trainer.accelerator.unwrap_model(trainer.model).state_dict()
        torch.save({k: v.detach().clone() for k, v in final.items()}, Path(output_dir) / "final_weights.pt")
    print(f"rank {rank}: vLLM run done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
