"""Code RL with STAPO or one of its baselines: recipe → Eurus-2-RL-Data code problems → code_reward → STAPOTrainer.

The command line (recipe, --method, --help, early checks) is stapo_trl.cli; this script wires the code task.
"""

import functools
from dataclasses import dataclass, field
from pathlib import Path

from stapo_trl.cli import (
    TOY,
    TrainingScript,
    TrainingScriptArguments,
    UsageError,
    check_data_source,
    is_main_launcher_process,
    run,
)


DESCRIPTION = """\
Train a model on code problems (Eurus-2-RL-Data's code split, as the paper) with STAPO or one of the paper's
baselines (--method), rewarded +1/-1 by code_reward as PRIME grades Eurus-2 (veRL's prime_code: its program
extraction, preamble, standard-input wrapping and output comparison): the completion's program passes every test
of its problem, run in the local sandbox, or not (--partial_credit: veRL's fraction of tests instead of -1). Writes the model, trainer_state.json (the logs) and
results.json to --output_dir."""

EXAMPLES = """\
python examples/train_code.py                          # offline demo on a CPU: toy model, six sample problems
python examples/train_code.py --max_steps 2 --method justrl
accelerate launch --config_file examples/accelerate_configs/fsdp2.yaml examples/train_code.py \\
    --config examples/recipes/Qwen3-1.7B-Base/code.yaml [--method justrl|grpo|20_entropy|...]
... --resume_from_checkpoint latest                     # continue a run in its output_dir"""


@dataclass
class CodeScriptArguments(TrainingScriptArguments):
    dataset_name: str = field(
        default="PRIME-RL/Eurus-2-RL-Data",
        metadata={
            "help": "Training problems in Eurus-2-RL-Data's veRL layout: a Hub dataset id, local parquet/jsonl "
            "files or a directory of them, or 'toy' (the six sample problems shipped with the package). Rows whose "
            "ability is not 'code' are skipped."
        },
    )
    dataset_split: str = field(default="train", metadata={"help": "The Hub split (ignored for local files)."})
    keep_system_prompt: bool = field(
        default=True,
        metadata={"help": "Keep each prompt's system message (PRIME's, as the paper's veRL run); false: user only."},
    )
    drop_invalid_rows: bool = field(
        default=False,
        metadata={"help": "Drop (and count) rows with a malformed prompt or tests instead of stopping with an error."},
    )
    max_prompt_length: int | None = field(
        default=None,
        metadata={"help": "Drop problems whose rendered prompt is longer than this many tokens (the paper: 1024)."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training problems."})
    test_timeout: float = field(
        default=5.0,
        metadata={"help": "Seconds of wall and CPU time per test (PRIME's code reward allows 5); a slower program "
                  "scores -1."},
    )  # fmt: skip
    partial_credit: bool = field(
        default=False,
        metadata={"help": "veRL's partial credit for failing programs (the fraction f of the first 10 tests passed, "
                  "as 2f - 1) instead of PRIME's -1; a program passing every test earns +1 either way."},
    )  # fmt: skip
    judge_workers: int | None = field(
        default=None,
        metadata={"help": "Programs judged at once by each training process (default: its CPU cores)."},
    )


SCRIPT = TrainingScript(
    prog="examples/train_code.py",
    description=DESCRIPTION,
    examples=EXAMPLES,
    arguments=CodeScriptArguments,
    offline_recipe=Path(__file__).resolve().parent / "recipes" / "toy" / "code_cpu.yaml",
)


def load_problems(script_args: CodeScriptArguments):
    """The prompt dataset (`prompt`, `tests`); a bad source is a UsageError naming --dataset_name."""
    from stapo_trl.code.data import SAMPLE_FILE, load_eurus_code

    source = script_args.dataset_name
    check_data_source(source)
    try:
        dataset = load_eurus_code(
            SAMPLE_FILE if source == TOY else source,
            script_args.dataset_split,
            drop_invalid=script_args.drop_invalid_rows,
            keep_system_prompt=script_args.keep_system_prompt,
        )
    except (OSError, ValueError) as error:
        raise UsageError(f"--dataset_name {source}: {error}") from None
    if script_args.max_train_samples is not None:
        dataset = dataset.select(range(min(script_args.max_train_samples, len(dataset))))
    return dataset


def main(script_args: CodeScriptArguments, training_args, model_args) -> None:
    from stapo_trl import STAPOTrainer, code_reward
    from stapo_trl.cli import model_and_peft_config, train_and_save

    if not script_args.test_timeout > 0:
        raise UsageError(f"--test_timeout {script_args.test_timeout}: must be a positive number of seconds.")
    if script_args.judge_workers is not None and script_args.judge_workers < 1:
        raise UsageError(f"--judge_workers {script_args.judge_workers}: must be at least 1.")
    train_dataset = load_problems(script_args)  # data first: a bad dataset fails before any model is loaded
    # The reward's settings as keyword arguments (as open-r1 configures its rewards); the name stays for TRL's logs.
    reward = functools.update_wrapper(
        functools.partial(
            code_reward,
            timeout=script_args.test_timeout,
            workers=script_args.judge_workers,
            partial_credit=script_args.partial_credit,
        ),
        code_reward,
    )

    if model_args.model_name_or_path in (None, TOY) and is_main_launcher_process():
        print(
            "Note: the toy model was pre-trained on arithmetic, not code, so it writes no passing program: expect "
            "reward -1 and loss 0 throughout (a group whose completions all score alike has zero advantages). "
            "This run shows the wiring: prompts, generation, the sandboxed tests, STAPO's loss."
        )
    model_path, peft_config = model_and_peft_config(training_args, model_args)
    if script_args.max_prompt_length is not None:
        from transformers import AutoTokenizer

        from stapo_trl.code.data import drop_long_prompts

        tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
        train_dataset = drop_long_prompts(train_dataset, tokenizer, script_args.max_prompt_length)
        if len(train_dataset) == 0:
            raise UsageError(f"--max_prompt_length {script_args.max_prompt_length}: every prompt is longer.")
    trainer = STAPOTrainer(
        model=model_path,
        reward_funcs=reward,
        args=training_args,
        train_dataset=train_dataset,
        peft_config=peft_config,
    )
    train_and_save(trainer, script_args.method, model_path, dataset_name=script_args.dataset_name)


if __name__ == "__main__":
    run(SCRIPT, main)
