"""Math RL with STAPO or one of its baselines: config → dataset → reward → STAPOTrainer.

    # Offline demo on a CPU (tiny Qwen3 + synthetic problems; the recipe examples/recipes/toy/stapo_cpu.yaml)
    python examples/train_math.py
    python examples/train_math.py --max_steps 20 --method justrl      # the same recipe, changed

    # The paper's runs (see docs/launching.md)
    accelerate launch --config_file examples/accelerate_configs/fsdp2.yaml examples/train_math.py \\
        --config examples/recipes/Qwen3-1.7B-Base/stapo.yaml

    # The same recipe as a baseline: --method justrl | justrl_fullmask | grpo | 20_entropy | high_entropy_mask | ...
"""

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from trl import ModelConfig, TrlParser, get_peft_config

from stapo_trl import STAPOConfig, STAPOTrainer, math_reward
from stapo_trl.math.data import DAPO_MATH_HUB_ID, load_dapo_math, load_math_dataset, load_verl_parquet
from stapo_trl.methods import METHODS, method_config

OFFLINE_RECIPE = Path(__file__).resolve().parent / "recipes" / "toy" / "stapo_cpu.yaml"
TOY = "toy"


@dataclass
class MathScriptArguments:
    method: str = field(
        default="stapo",
        metadata={
            "help": "Which method to train; its STAPOConfig values (stapo_trl.methods.METHODS) become defaults that "
            "the recipe and the command line can override.",
            "choices": sorted(METHODS),
        },
    )
    dataset_name: str = field(
        default=DAPO_MATH_HUB_ID,
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
        default=None,
        metadata={"help": "Directory of the veRL benchmark files (e.g. ../shared/data/math_eval); default: Hub."},
    )
    eval_every_steps: int = field(default=50, metadata={"help": "Evaluate eval_benchmark every N optimizer steps."})
    eval_num_samples: int = field(default=4, metadata={"help": "Samples per problem for eval_benchmark (avg@k)."})
    eval_max_problems: int | None = field(default=None, metadata={"help": "Only the first K problems (default: all)."})
    eval_preset: str = field(
        default="t1.0", metadata={"help": "Decoding: t1.0 (T=1.0, top-p 1.0), t0.7 (T=0.7, top-p 0.9) or T:top_p."}
    )
    eval_max_new_tokens: int | None = field(default=None, metadata={"help": "Default: max_completion_length."})
    eval_benchmark_on_start: bool = field(default=True, metadata={"help": "Also evaluate before the first step."})


def make_parser() -> TrlParser:
    return TrlParser((MathScriptArguments, STAPOConfig, ModelConfig))


def parse_args(argv: list[str] | None = None) -> tuple[MathScriptArguments, STAPOConfig, ModelConfig]:
    """Parse like TRL's scripts, with two additions: the method's values as defaults, and the offline recipe.

    Precedence: command line > recipe (`--config`) > method (`--method`, or `method:` in the recipe) > STAPOConfig.
    Without `--config` and without `--model_name_or_path`, the offline CPU recipe is the base, so
    `python examples/train_math.py --max_steps 20` is the offline demo, shorter.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" not in argv and "--model_name_or_path" not in argv:
        argv = ["--config", str(OFFLINE_RECIPE), *argv]
    pre_parser = argparse.ArgumentParser(add_help=False)
    pre_parser.add_argument("--config")
    pre_parser.add_argument("--method")
    known, _ = pre_parser.parse_known_args(argv)
    method = known.method
    if method is None and known.config:
        with open(known.config) as recipe:
            method = (yaml.safe_load(recipe) or {}).get("method")
    parser = make_parser()
    parser.set_defaults(**method_config(method or "stapo"))
    return parser.parse_args_and_config(argv)


def load_prompts(source: str, dataset_format: str, script_args: MathScriptArguments):
    if dataset_format == "dapo":
        return load_dapo_math(source, drop_invalid=script_args.drop_invalid_rows)
    if dataset_format == "verl":
        return load_verl_parquet(source, drop_invalid=script_args.drop_invalid_rows)
    return load_math_dataset(
        source, script_args.problem_field, script_args.answer_field, drop_invalid=script_args.drop_invalid_rows
    )


def heldout_accuracy(model_path: str, script_args: MathScriptArguments, training_args: STAPOConfig) -> float:
    from stapo_trl.evaluation import load_model_for_evaluation, sampled_accuracy

    if script_args.heldout_dataset == TOY:
        from stapo_trl.toy import toy_dataset_files

        heldout = load_dapo_math(toy_dataset_files()["heldout"])
    else:
        heldout = load_verl_parquet(script_args.heldout_dataset)
    if script_args.heldout_max_problems is not None:
        heldout = heldout.select(range(min(script_args.heldout_max_problems, len(heldout))))
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
    )


def main(script_args: MathScriptArguments, training_args: STAPOConfig, model_args: ModelConfig) -> None:
    start = time.perf_counter()
    # Data first: a bad dataset fails before any model is loaded.
    dataset_name = script_args.dataset_name
    if dataset_name == TOY:
        from stapo_trl.toy import toy_dataset_files

        dataset_name = toy_dataset_files()["train"]
    train_dataset = load_prompts(dataset_name, script_args.dataset_format, script_args)
    if script_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(min(script_args.max_train_samples, len(train_dataset))))

    model_path = model_args.model_name_or_path
    if model_path in (None, TOY):
        from stapo_trl.toy import toy_checkpoint

        model_path = toy_checkpoint()
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }

    trainer = STAPOTrainer(
        model=model_path,
        reward_funcs=math_reward,
        args=training_args,
        train_dataset=train_dataset,
        peft_config=get_peft_config(model_args),
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
    accelerator = trainer.accelerator
    processes = f"{accelerator.num_processes} process" + ("es" if accelerator.num_processes > 1 else "")
    accelerator.print(
        f"Method {script_args.method} ({processes}): spurious_mask_mode={training_args.spurious_mask_mode}, "
        f"τ_p={training_args.spurious_prob_threshold}, q={training_args.spurious_entropy_quantile}, "
        f"loss_type={training_args.loss_type}; {len(train_dataset)} training problems."
    )

    accuracy_before = None
    if script_args.heldout_dataset and accelerator.is_main_process:
        accuracy_before = heldout_accuracy(model_path, script_args, training_args)
        print(f"Held-out accuracy before training: {accuracy_before:.3f}")

    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json beside the model: the logs that `stapo-report plots` reads
    accelerator.print(f"Model saved to {Path(training_args.output_dir).resolve()}")

    results = {"method": script_args.method, "seed": training_args.seed, "steps": trainer.state.global_step}
    if script_args.heldout_dataset:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            accuracy_after = heldout_accuracy(training_args.output_dir, script_args, training_args)
            print(
                f"Held-out accuracy ({script_args.heldout_num_samples} samples per problem, "
                f"T={training_args.temperature}): before {accuracy_before:.3f}, after {accuracy_after:.3f}"
            )
            results.update(heldout_accuracy_before=accuracy_before, heldout_accuracy_after=accuracy_after)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
        accelerator.print(f"Pushed to the Hub: {trainer.hub_model_id}")
    results["seconds"] = round(time.perf_counter() - start, 1)
    if accelerator.is_main_process:
        (Path(training_args.output_dir) / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    accelerator.print(f"Done in {results['seconds']:.0f} s.")
    trainer.end()


if __name__ == "__main__":
    main(*parse_args())
