"""One STAPOTrainer run with TRL's colocated vLLM generation on the CPU, in a process of its own (tests/test_vllm.py).

    python tests/vllm_training_run.py MODEL_DIR OUTPUT_DIR MODE CLIP_MAX [ACCUMULATION STEPS_PER_GENERATION MAX_STEPS]
    accelerate launch --multi_gpu --num_processes 2 ... tests/vllm_training_run.py MODEL_DIR OUTPUT_DIR MODE CLIP_MAX

IMPORTANCE_SAMPLING_MODE and CLIP_MAX are TRL's vllm_importance_sampling_mode and vllm_importance_sampling_clip_max;
ACCUMULATION and STEPS_PER_GENERATION default to 1, MAX_STEPS to 3.

Each process writes OUTPUT_DIR/recorded_rank<r>.pt: every training micro-batch as the loss received it, the weights
the loss was computed with (whole, also under FSDP) and the loss it returned, and OUTPUT_DIR/synced_rank<r>.pt: after
each weight sync, vLLM's embeddings and norms next to the trainer's. Process 0 also writes the log history and the
final weights.
For a colocated vLLM, TRL sets RANK, WORLD_SIZE and MASTER_* in the environment for good: one run per process.
"""

import json
import sys
from pathlib import Path

import torch
import vllm_cpu_weight_sync
from datasets import Dataset
from torch.distributed.tensor import DTensor

from stapo_trl import STAPOConfig, STAPOTrainer


# With a ~100-token vocabulary a random model gives most tokens probability ~0.01: τ_p = 0.02 makes candidates common.
TAU_P = 0.02
LEARNING_RATE = 1e-2  # large, so that one update moves the log-probabilities far more than vLLM's bf16 rounding does


def varied_reward(completions, **kwargs):
    """Deterministic, and different within a group of random completions, so that advantages and candidates exist."""
    return [float(sum(map(ord, completion[0]["content"])) % 3) - 1.0 for completion in completions]


# Parameters outside every decoder layer (under FSDP2: the root unit's) and one inside a layer, compared after syncs.
SYNC_CHECKED = ("model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight")


def whole_weights(model) -> dict:
    """The model's weights as full tensors: under FSDP2 each process holds a shard (a DTensor), gathered here (every
    process calls this at the same point, as the gather is collective)."""
    return {
        name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().clone()
        for name, value in model.state_dict().items()
    }


class RecordingSTAPOTrainer(STAPOTrainer):
    """STAPOTrainer that keeps what each training micro-batch's loss saw (its inputs, the weights and the loss), and
    what vLLM holds after each weight sync."""

    recorded: list
    synced: list

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        if self.model.training:
            self.recorded.append(
                {
                    "global_step": self.state.global_step,
                    "inputs": {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)},
                    "weights": whole_weights(self.accelerator.unwrap_model(model)),
                    "loss": loss.detach().clone(),
                }
            )
        return loss

    def _generate_single_turn(self, *args, **kwargs):
        output = super()._generate_single_turn(*args, **kwargs)  # syncs the weights first when they changed
        if self.model.training:
            vllm_model = self.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.get_model()
            vllm_weights = dict(vllm_model.named_parameters())
            trainer_weights = whole_weights(self.accelerator.unwrap_model(self.model))
            self.synced.append(
                {
                    "global_step": self.state.global_step,
                    "vllm": {name: vllm_weights[name].detach().float().clone() for name in SYNC_CHECKED},
                    "trainer": {name: trainer_weights[name] for name in SYNC_CHECKED},
                }
            )
        return output


def main(model_dir: str, output_dir: str, importance_sampling_mode: str, clip_max: str, accumulation: str = "1",
         steps_per_generation: str = "1", max_steps: str = "3") -> None:  # fmt: skip
    vllm_cpu_weight_sync.install()
    prompts = [[{"role": "user", "content": f"What is {a}+{a + 1}?"}] for a in range(32)]
    config = STAPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        report_to="none",
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        per_device_train_batch_size=8 // int(accumulation),
        gradient_accumulation_steps=int(accumulation),
        steps_per_generation=int(steps_per_generation),
        num_generations=4,
        max_completion_length=16,
        max_steps=int(max_steps),
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
    trainer.recorded, trainer.synced = [], []
    trainer.train()
    rank = trainer.accelerator.process_index
    torch.save(trainer.recorded, Path(output_dir) / f"recorded_rank{rank}.pt")
    torch.save(trainer.synced, Path(output_dir) / f"synced_rank{rank}.pt")
    final = whole_weights(trainer.accelerator.unwrap_model(trainer.model))
    if trainer.accelerator.is_main_process:
        (Path(output_dir) / "log_history.json").write_text(json.dumps(trainer.state.log_history))
        torch.save(final, Path(output_dir) / "final_weights.pt")
    print(f"rank {rank}: vLLM run done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
