"""`BenchmarkEvalCallback`: avg@k on one benchmark every N optimizer steps during training (paper Fig. 5a)."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Any

from transformers import TrainerCallback

from .benchmarks import Benchmark
from .generation import generate_seeded, sample_seed
from .grading import grade_rules
from .presets import Preset, parse_preset
from .tasks import get_task


logger = logging.getLogger(__name__)


def reshard_fsdp_modules(model) -> int:
    """Reshard every FSDP2 module of `model` (``fully_shard``); returns how many were unsharded.

    A forward pass outside the training step (a no-grad ``generate``) leaves the FSDP2 groups that do not reshard
    after forward (accelerate puts the final norm and lm_head in one, the root) holding unsharded plain
    parameters; TRL's next weight sync to vLLM then calls ``full_tensor()`` on them and fails. Resharding gives
    them back their sharded DTensor parameters.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return 0
    count = 0
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
            count += 1
    return count


class BenchmarkEvalCallback(TrainerCallback):
    """avg@k on one benchmark every `every_n_steps` optimizer steps, logged as ``eval/<benchmark>/avg@<k>``.

    For the accuracy-over-training curves (paper Fig. 5a). Generation uses the current policy with transformers
    ``generate`` and the per-sample seeds of `evaluate` (the same seeds at every evaluation, so the curve's steps
    differ by the model, not by the sampling noise); grading uses the task's rules (`grade_rules`).

    Every process takes part: the samples are split into equal shards, each process generates its shard with the
    same number of ``generate`` calls (needed under FSDP / ZeRO-3, where every forward pass is collective), and the
    results are gathered, so all processes log the same numbers and none waits on a collective the others skip.
    Under FSDP2 the modules are resharded after generating (`reshard_fsdp_modules`), so that the next weight sync
    to a colocated vLLM finds sharded parameters. Pass the trainer (``trainer.add_callback(BenchmarkEvalCallback(..., trainer=trainer))``) so that the model is
    unwrapped as TRL does for its own generation and the metric reaches the trainer's loggers (``on_log``) and
    ``trainer_state.json``; without it the metric is only appended to ``state.log_history``.
    """

    def __init__(
        self,
        benchmark: str | Benchmark = "AIME24",
        *,
        task: str = "math",
        every_n_steps: int,
        num_samples: int = 4,
        max_problems: int | None = None,
        preset: str | Preset = "t1.0",
        benchmarks_dir: str | None = None,
        max_new_tokens: int | None = None,
        batch_size: int = 16,
        seed: int = 0,
        eval_on_start: bool = False,
        trainer=None,
    ):
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.task = get_task(task)
        self.benchmark = self.task.parse_benchmark(benchmark)
        self.problems = self.task.load_benchmark(self.benchmark, benchmarks_dir, max_problems)
        self.every_n_steps = every_n_steps
        self.num_samples = num_samples
        self.preset = parse_preset(preset)
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.seed = seed
        self.eval_on_start = eval_on_start
        self.trainer = trainer

    @property
    def metric_prefix(self) -> str:
        return f"eval/{self.benchmark.name}"

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.eval_on_start and state.global_step == 0:
            return self._evaluate_and_log(args, state, control, model, processing_class)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.global_step > 0 and state.global_step % self.every_n_steps == 0:
            return self._evaluate_and_log(args, state, control, model, processing_class)

    def _evaluate_and_log(self, args, state, control, model, processing_class):
        tokenizer = processing_class if self.trainer is None else self.trainer.processing_class
        max_new_tokens = self.max_new_tokens or getattr(args, "max_completion_length", None) or 1024
        started = time.monotonic()
        with self._generation_model(model) as generation_model:
            results = self._shard_results(generation_model, tokenizer, max_new_tokens)
        for module in {
            id(m): m for m in (model, getattr(self.trainer, "model_wrapped", None)) if m is not None
        }.values():
            reshard_fsdp_modules(module)
        correct_by_problem: dict[str, list[bool]] = {}
        lengths = []
        for problem_id, correct, num_tokens in results:
            correct_by_problem.setdefault(problem_id, []).append(correct)
            if num_tokens is not None:
                lengths.append(num_tokens)
        scores = [sum(values) / len(values) for values in correct_by_problem.values()]
        metrics = {
            f"{self.metric_prefix}/avg@{self.num_samples}": 100 * sum(scores) / len(scores) if scores else math.nan,
            f"{self.metric_prefix}/mean_response_length": sum(lengths) / len(lengths) if lengths else math.nan,
            f"{self.metric_prefix}/seconds": time.monotonic() - started,
        }
        state.log_history.append({**metrics, "step": state.global_step})
        if self.trainer is not None:  # the loggers (trackio, wandb...) and the progress bar
            should_log = control.should_log  # the handler's on_log clears it: the step's own log must still happen
            control = self.trainer.callback_handler.on_log(args, state, control, logs=dict(metrics))
            control.should_log = should_log
        return control

    def _generation_model(self, model):
        """The model to generate with: unwrapped (DeepSpeed ZeRO-3 parameters gathered, FSDP1 summoned) as TRL's
        own transformers generation does, when the trainer is known."""
        trainer = self.trainer
        if trainer is None:
            return contextlib.nullcontext(model)
        from trl.models import unwrap_model_for_generation

        @contextlib.contextmanager
        def unwrapped():
            with unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                gather_deepspeed3_params=getattr(trainer.args, "ds3_gather_for_generation", True),
                gradient_checkpointing_kwargs=getattr(trainer.args, "gradient_checkpointing_kwargs", None),
            ) as unwrapped_model:
                try:
                    from trl.distributed import DistributedBackend

                    summon = DistributedBackend(trainer.accelerator).summon_full_params(
                        trainer.model_wrapped, recurse=False
                    )
                except (ImportError, AttributeError, TypeError):
                    summon = contextlib.nullcontext()
                with summon:
                    yield unwrapped_model

        return unwrapped()

    def _shard_results(self, model, tokenizer, max_new_tokens: int) -> list[tuple[str, bool, int | None]]:
        """(problem id, correct, tokens) of every sample, generated in equal shards over the processes."""
        import torch.distributed as dist

        distributed = dist.is_available() and dist.is_initialized()
        rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
        requests = [
            (
                problem_id,
                prompt,
                gold,
                sample_seed(self.seed, self.benchmark.name, problem_id, index),
            )
            for problem_id, prompt, gold in zip(
                self.problems["id"],
                self.problems["prompt"],
                self.problems[self.task.gold_column],
            )
            for index in range(self.num_samples)
        ]
        shard = requests[rank::world]
        real = len(shard)
        shard += [requests[0]] * (math.ceil(len(requests) / world) - real)  # equal generate calls on every process
        texts: list[str | None] = []
        lengths: list[int | None] = []
        for start in range(0, len(shard), self.batch_size):
            batch = shard[start : start + self.batch_size]
            try:
                generations = generate_seeded(
                    model,
                    tokenizer,
                    [prompt for _, prompt, _, _ in batch],
                    [seed for _, _, _, seed in batch],
                    temperature=self.preset.temperature,
                    top_p=self.preset.top_p,
                    max_new_tokens=max_new_tokens,
                )
                texts += [generation.text for generation in generations]
                lengths += [generation.num_tokens for generation in generations]
            except Exception as error:  # counted as incorrect, like a failed sample of `evaluate`
                logger.warning("in-training evaluation: generation failed for a batch: %r", error)
                texts += [None] * len(batch)
                lengths += [None] * len(batch)
        shard, texts, lengths = shard[:real], texts[:real], lengths[:real]
        generated = [i for i, text in enumerate(texts) if text is not None]
        grades = grade_rules(
            self.task,
            [texts[i] for i in generated],
            [shard[i][2] for i in generated],
            {},
        )
        correct = [False] * real
        for i, grade in zip(generated, grades):
            correct[i] = grade["correct"]
        local = [(problem_id, correct[i], lengths[i]) for i, (problem_id, _, _, _) in enumerate(shard)]
        if not distributed:
            return local
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, local)
        return [item for part in gathered for item in part]
