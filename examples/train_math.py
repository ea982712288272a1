"""Math RL with STAPO or one of its baselines: recipe → DAPO-layout problems → math_reward → STAPOTrainer.

The command line (recipe, --method, --help, early checks) is stapo_trl.cli; this script wires the math task.
"""

from dataclasses import dataclass, field
from pathlib import Path

from stapo_trl.cli import TOY, TrainingScript, TrainingScriptArguments, UsageError, check_data_source, run


DESCRIPTION = """\
Train a model on math problems with STAPO (S2T silencing of spurious tokens) or one of the paper's baselines
(--method), rewarded +1/-1 by math_reward (math-verify). Writes the model, trainer_state.json (the logs) and
results.json to --output_dir; with --heldout_dataset, prints accuracy before and after."""

EXAMPLES = """\
python examples/train_math.py                          # offline demo on a CPU: toy model, toy problems
python examples/train_math.py --max_steps 20 --method justrl
accelerate launch --config_file examples/accelerate_configs/fsdp2.yaml examples/train_math.py \\
    --config examples/recipes/Qwen3-1.7B-Base/stapo.yaml [--method justrl|grpo|20_entropy|...]
python examples/train_math.py --config examples/recipes/Qwen3-1.7B-Base/stapo_lora_1gpu.yaml   # one GPU, LoRA
... --resume_from_checkpoint latest                     # continue a run in its output_dir"""


@dataclass
class MathScriptArguments(TrainingScriptArguments):
    dataset_name: str = field(
        default="BytedTsinghua-SIA/DAPO-Math-17k",
        metadata={"help": "Training problems: a Hub dataset id, a local file or directory, or 'toy' (synthetic)."},
    )
    dataset_format: str = field(
        default="dapo",
        metadata={
            "help": "'dapo' (DAPO-Math-17K's veRL layout), 'verl' (veRL parquet, problem as the prompt), or "
            "'fields' (any jsonl/parquet/Hub dataset: set problem_field and answer_field).",
            "choices": ["dapo", "verl", "fields"],
        },
    )
    problem_field: str = field(default="problem", metadata={"help": "Problem field for dataset_format 'fields'."})
    answer_field: str = field(default="answer", metadata={"help": "Answer field for dataset_format 'fields'."})
    drop_invalid_rows: bool = field(
        default=False,
        metadata={"help": "Drop (and count) rows without a problem or answer instead of stopping with an error."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training problems."})
    heldout_dataset: str | None = field(
        default=None,
        metadata={
            "help": "Problems to measure accuracy on before and after training: a veRL parquet file (e.g. one of "
            "the math benchmarks) or 'toy'. Evaluated on the main process with transformers generate."
        },
    )
    heldout_max_problems: int | None = field(default=200, metadata={"help": "Evaluate on at most this many problems."})
    heldout_num_samples: int = field(default=4, metadata={"help": "Samples per held-out problem (avg@N)."})
    eval_benchmark: str | None = field(
        default=None,
        metadata={
            "help": "Benchmark to measure during training (paper Fig. 5a), e.g. AIME24: a stapo_trl.evaluation "
            "registry name or NAME=SOURCE[,problem=F,answer=F]. Logged as eval/<benchmark>/avg@<k>."
        },
    )
    eval_benchmarks_dir: str | None = field(
        default=None, metadata={"help": "Directory of the veRL benchmark files (default: stapo_trl.evaluation's)."}
    )
    eval_every_steps: int = field(default=50, metadata={"help": "Evaluate eval_benchmark every N optimizer steps."})
    eval_num_samples: int = field(default=4, metadata={"help": "Samples per problem for eval_benchmark (avg@k)."})
    eval_max_problems: int | None = field(default=None, metadata={"help": "Only the first K problems (default: all)."})
    eval_preset: str = field(
        default="t1.0", metadata={"help": "Decoding: t1.0 (T=1.0, top-p 1.0), t0.7 (T=0.7, top-p 0.9) or T:top_p."}
    )
    eval_max_new_tokens: int | None = field(default=None, metadata={"help": "Default: max_completion_length."})
    eval_benchmark_on_start: bool = field(default=True, metadata={"help": "Also evaluate before the first step."})


SCRIPT = TrainingScript(
    prog="examples/train_math.py",
    description=DESCRIPTION,
    examples=EXAMPLES,
    arguments=MathScriptArguments,
    offline_recipe=Path(__file__).resolve().parent / "recipes" / "toy" / "stapo_cpu.yaml",
)


def load_problems(source: str, script_args: MathScriptArguments, flag: str):
    """A prompt dataset (`prompt`, `solution`) in the chosen layout; a bad source is a UsageError naming `flag`."""
    from stapo_trl.math.data import load_dapo_math, load_math_dataset, load_verl_parquet

    check_data_source(source, flag)
    if source == TOY:
        from stapo_trl.toy import toy_dataset_files

        source = toy_dataset_files()["train" if flag == "--dataset_name" else "heldout"]
    drop = script_args.drop_invalid_rows
    try:
        if flag == "--heldout_dataset":  # veRL parquet, or the toy problems in DAPO layout
            return load_dapo_math(source) if script_args.heldout_dataset == TOY else load_verl_parquet(source)
        if script_args.dataset_format == "dapo":
            return load_dapo_math(source, drop_invalid=drop)
        if script_args.dataset_format == "verl":
            return load_verl_parquet(source, drop_invalid=drop)
        return load_math_dataset(source, script_args.problem_field, script_args.answer_field, drop_invalid=drop)
    except (OSError, ValueError) as error:
        raise UsageError(f"{flag} {source}: {error}") from None


def heldout_accuracy(model_path: str, heldout, script_args: MathScriptArguments, training_args) -> float:
    from stapo_trl.evaluation import load_model_for_evaluation, sampled_accuracy

    model, tokenizer = load_model_for_evaluation(model_path)
    return sampled_accuracy(
        model,
        tokenizer,
        heldout,
        num_samples=script_args.heldout_num_samples,
        temperature=training_args.temperature,
        top_p=training_args.top_p,
        max_new_tokens=training_args.max_completion_length,
        seed=training_args.seed,
        progress=f"Held-out accuracy: {len(heldout)} problems x {script_args.heldout_num_samples} samples",
    )


def main(script_args: MathScriptArguments, training_args, model_args) -> None:
    from stapo_trl import STAPOTrainer, math_reward
    from stapo_trl.cli import model_and_peft_config, train_and_save

    # Data first: a bad dataset fails before any model is loaded.
    train_dataset = load_problems(script_args.dataset_name, script_args, "--dataset_name")
    if script_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(min(script_args.max_train_samples, len(train_dataset))))
    evaluate = None
    if script_args.heldout_dataset:
        heldout = load_problems(script_args.heldout_dataset, script_args, "--heldout_dataset")
        if script_args.heldout_max_problems is not None:
            heldout = heldout.select(range(min(script_args.heldout_max_problems, len(heldout))))

        def evaluate(path):
            return heldout_accuracy(path, heldout, script_args, training_args)

    model_path, peft_config = model_and_peft_config(training_args, model_args)
    trainer = STAPOTrainer(
        model=model_path,
        reward_funcs=math_reward,
        args=training_args,
        train_dataset=train_dataset,
        peft_config=peft_config,
    )
    if script_args.eval_benchmark:
        from stapo_trl.evaluation import BenchmarkEvalCallback

        trainer.add_callback(
            BenchmarkEvalCallback(
                script_args.eval_benchmark,
                every_n_steps=script_args.eval_every_steps,
                num_samples=script_args.eval_num_samples,
                max_problems=script_args.eval_max_problems,
                preset=script_args.eval_preset,
                benchmarks_dir=script_args.eval_benchmarks_dir,
                max_new_tokens=script_args.eval_max_new_tokens,
                seed=training_args.seed,
                eval_on_start=script_args.eval_benchmark_on_start,
                trainer=trainer,
            )
        )
    train_and_save(trainer, script_args.method, model_path, evaluate, dataset_name=script_args.dataset_name)


if __name__ == "__main__":
    run(SCRIPT, main)
