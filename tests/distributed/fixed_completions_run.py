"""STAPOTrainer on fixed completions, run by tests/distributed/test_fsdp.py in 1 or 2 processes (FSDP2, DDP or none).

The completions are a function of the prompt and of the process that would hold it in a 2-process run (TRL's
`rollout_func`), not sampled, so every layout trains on the same completions. The 2-process layouts see 8
completions per micro-batch in all (4 per process), accumulation 2, `steps_per_generation` 4, `num_iterations` 2: 4
optimizer steps per generation, 8 steps over 2 generations, a checkpoint after step 4. The one-process layout takes
micro-batches of 8 and orders each generation batch as the two processes hold it (TRL shuffles it otherwise), so its
optimizer steps pool the same 16 completions as theirs.

Writes, under OUTPUT_DIR: `decisions-rank<i>.pt` (every training micro-batch of this process with its optimizer step
and the step's S2T decision), `final/` (the model, saved by `save_model`) and, under FSDP, `fsdp-rank<i>` (the class of the
prepared model). `--uneven`: the second process's completions are 1 token long and all rewarded alike (advantage 0,
no candidates), the first's 12 tokens. `--resume`: continue OUTPUT_DIR's run from its last complete checkpoint, as
`--resume_from_checkpoint latest` does. `--lora`: train a LoRA adapter (with TRL's default LoRA dropout, 0.05) instead
of the whole model.

    python fixed_completions_run.py OUTPUT_DIR [--uneven] [--resume] [--lora]
"""

import argparse
import os
import sys
import zlib
from pathlib import Path

import torch
import trl.trainer.grpo_trainer
from datasets import Dataset
from peft import LoraConfig


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: conftest's settings

from conftest import cpu_config  # noqa: E402

from stapo_trl import STAPOTrainer  # noqa: E402
from stapo_trl.output_dir import resolve_resume  # noqa: E402
from stapo_trl.toy.model import tiny_qwen3  # noqa: E402
from stapo_trl.toy.tokenizer import build_tokenizer  # noqa: E402


PROCESSES = 2  # the layout the completions are assigned for
COMPLETIONS_PER_MICRO_BATCH = 8  # over all processes
FIRST_TOKEN_ID = 3  # after the toy tokenizer's special tokens (0, 1, 2)


def fixed_rollout(uneven: bool):
    """TRL `rollout_func`: for each prompt (repeated num_generations times in a row) the same completions in every
    layout. The k-th completion of a prompt is drawn from a generator seeded by the prompt text and k."""

    def rollout(prompts, trainer):
        tokenizer = trainer.processing_class
        world, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
        prompt_ids, completion_ids, previous, k = [], [], None, 0
        for position, prompt in enumerate(prompts):
            k = k + 1 if prompt == previous else 0
            previous = prompt
            # The process that holds this completion in the 2-process layout (in one process: by position).
            holder = rank if world == PROCESSES else position * PROCESSES // len(prompts)
            text = prompt[-1]["content"]
            generator = torch.Generator().manual_seed(zlib.crc32(f"{text}/{k}".encode()))
            if uneven:
                length = 12 if holder == 0 else 1
            else:
                length = int(torch.randint(3, 9, (1,), generator=generator))
            ids = torch.randint(FIRST_TOKEN_ID, len(tokenizer), (length,), generator=generator).tolist()
            prompt_ids.append(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=False))
            completion_ids.append(ids)
        logprobs = [[0.0] * len(ids) for ids in completion_ids]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    return rollout


def token_sum_reward(completion_ids, **kwargs):
    """Varies within groups; a 1-token completion gets 0, so a group of them has advantage 0."""
    return [0.0 if len(ids) == 1 else float(sum(ids) % 3) - 1.0 for ids in completion_ids]


def as_two_processes_hold_it(batch: dict) -> dict:
    """One process's generation batch reordered so that its micro-batch j holds what both processes' j-th
    micro-batches hold (instead of TRL's random shuffle): process p holds rows [p n/2, (p+1) n/2) in order."""
    size = len(next(value for value in batch.values() if value is not None))
    half, per_process = size // PROCESSES, COMPLETIONS_PER_MICRO_BATCH // PROCESSES
    order = [
        process * half + offset + row
        for offset in range(0, half, per_process)
        for process in range(PROCESSES)
        for row in range(per_process)
    ]

    def reorder(value):
        if value is None or (isinstance(value, torch.Tensor) and value.dim() == 0):
            return value
        return value[order] if isinstance(value, torch.Tensor) else [value[i] for i in order]

    return {key: reorder(value) for key, value in batch.items()}


class RecordingTrainer(STAPOTrainer):
    """Keeps each training micro-batch of this process as its loss received it, with the step's S2T decision."""

    decisions: list

    def _compute_loss(self, model, inputs):
        if self.model.training:
            keys = (
                "prompt_ids",
                "prompt_mask",
                "completion_ids",
                "completion_mask",
                "advantages",
                "spurious_silenced",
            )
            self.decisions.append({"step": self.state.global_step + 1, **{key: inputs[key].cpu() for key in keys}})
        return super()._compute_loss(model, inputs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--uneven", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--lora", action="store_true")
    args = parser.parse_args()
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"  # rollout_func's notice

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:  # TRL shuffles each generation batch; here it is ordered as 2 processes hold it
        trl.trainer.grpo_trainer.shuffle_sequence_dict = as_two_processes_hold_it
    else:  # each process keeps its share in order
        trl.trainer.grpo_trainer.shuffle_sequence_dict = lambda batch: batch
    tokenizer = build_tokenizer()
    prompts = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What is {a}+1?"}] for a in range(16)]})
    config = cpu_config(
        args.output_dir,
        per_device_train_batch_size=COMPLETIONS_PER_MICRO_BATCH // world,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        num_iterations=2,
        max_steps=8,
        max_completion_length=12,
        spurious_prob_threshold=0.02,  # a random 100-token model gives most tokens ~0.01
        learning_rate=1e-3,
        warmup_steps=0,
        save_strategy="steps",
        save_steps=4,
        save_only_model=False,
    )
    trainer = RecordingTrainer(
        model=tiny_qwen3(tokenizer, seed=0),
        reward_funcs=token_sum_reward,
        args=config,
        train_dataset=prompts,
        processing_class=tokenizer,
        rollout_func=fixed_rollout(args.uneven),
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=["q_proj", "v_proj"])
        if args.lora
        else None,
    )
    trainer.decisions = []
    resume = resolve_resume("latest", args.output_dir) if args.resume else None
    trainer.train(resume_from_checkpoint=resume)
    rank = trainer.accelerator.process_index
    output = Path(args.output_dir)
    if trainer.is_fsdp_enabled:
        (output / f"fsdp-rank{rank}").write_text(type(trainer.model_wrapped).__name__)
        from torch.distributed.fsdp import FSDPModule

        assert isinstance(trainer.model_wrapped, FSDPModule), type(trainer.model_wrapped)
    torch.save(trainer.decisions, output / f"decisions-rank{rank}.pt")
    trainer.save_model(str(output / "final"))
    print(f"rank {rank}: done, {type(trainer.model_wrapped).__name__}", flush=True)


if __name__ == "__main__":
    main()
