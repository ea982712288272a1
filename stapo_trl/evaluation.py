"""Evaluation as in the STAPO paper: avg@N on six math benchmarks under two decodings, graded like training.

The paper (§5.1; `REFERENCE.md`, "Evaluation protocol") reports avg@32 on AIME24, AIME25 and AMC23 and avg@4 on
MATH500, Minerva and OlympiadBench, each under two decodings (T=1.0 / top-p 1.0, and T=0.7 / top-p 0.9), with at
most 20,480 new tokens and the training prompt ``{problem} Please reason step by step, and put your final answer
within \\boxed{}.`` as one user turn. This module reproduces that protocol:

- `evaluate(model_path, EvalConfig(...))`: generates the samples that are not done yet, grades them with
  `grade_completions` (which calls `math_reward`, the training reward: one verification code path), appends each
  sample to ``<output_dir>/samples.jsonl`` as soon as it is graded, and writes ``summary.json`` and ``summary.md``.
  An interrupted run resumes where it stopped; a sample whose generation or grading fails is recorded with an
  ``error`` and retried on the next run.
- `regrade(output_dir)`: grades the stored completions again (after a change of the verifier) without generating.
- `markdown_table({model_name: summary, ...})`: the Table-2 layout, one block per decoding preset.
- `BENCHMARKS` / `PRESETS`: the registry of benchmarks (file in a veRL-layout directory such as
  ``shared/data/math_eval``, default avg@N, Hub id and field mapping) and of decodings; both overridable.
- `BenchmarkEvalCallback`: avg@k on one benchmark every N training steps, logged like a training metric.

Generation: vLLM when installed and a GPU is present (``backend="auto"``), else transformers ``generate``, batched.
Each sample ``(benchmark, problem id, sample index)`` has its own seed (`sample_seed`), so its completion does not
depend on the batch it was generated in, on the order of the requests, or on whether the run was interrupted.
With transformers the sampling is done by `SeededSampler`, which draws per-row noise from a per-sample generator
(exact sampling from the temperature-scaled, top-p-filtered distribution, by the Gumbel-max trick).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import LogitsProcessor, PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback

from .math.data import MATH_INSTRUCTION, load_math_dataset, load_verl_parquet
from .math.reward import extract_boxed_answer, math_reward

logger = logging.getLogger(__name__)

SAMPLES_FILE = "samples.jsonl"
RUN_FILE = "run.json"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"

# ---------------------------------------------------------------------------------------------------------------
# Registry: benchmarks and decoding presets
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Benchmark:
    """Where a benchmark's problems come from and how many samples per problem it gets by default.

    The source is, in this order: `source` when set (a local file / directory or a Hub id); else `file` inside the
    `benchmarks_dir` of the run, when a directory is given; else the Hub dataset `hub_id`. A local ``.parquet``
    file or directory is read in the veRL layout (`stapo_trl.data.load_verl_parquet`) unless `layout` is
    ``"fields"``; anything else (jsonl, Hub) with `problem_field` / `answer_field` / `id_field`
    (`stapo_trl.data.load_math_dataset`, dotted paths allowed: ``"final_answer.0"``).
    """

    name: str
    file: str | None = None
    num_samples: int = 4
    hub_id: str | None = None
    split: str = "test"
    problem_field: str = "problem"
    answer_field: str = "answer"
    id_field: str | None = None
    source: str | None = None
    layout: str = "auto"  # "auto", "verl" or "fields"

    def __post_init__(self):
        if self.layout not in ("auto", "verl", "fields"):
            raise ValueError(f"benchmark {self.name}: layout must be 'auto', 'verl' or 'fields', got {self.layout!r}")
        if self.num_samples < 1:
            raise ValueError(f"benchmark {self.name}: num_samples must be >= 1, got {self.num_samples}")


#: The paper's six benchmarks, in Table 2's column order. Files: the veRL-layout parquet files of
#: ``shared/data/math_eval``. The Hub ids and field mappings are the common public copies (the paper does not name
#: its copies); they could not be checked offline, so prefer the files, or override them.
BENCHMARKS: dict[str, Benchmark] = {
    benchmark.name: benchmark
    for benchmark in (
        Benchmark("AIME24", "AIME24.parquet", 32, "HuggingFaceH4/aime_2024", "train", id_field="id"),
        Benchmark("AIME25", "AIME25.parquet", 32, "math-ai/aime25", "test", id_field="id"),
        Benchmark("AMC23", "AMC23.parquet", 32, "math-ai/amc23", "test", problem_field="question", id_field="id"),
        Benchmark("MATH500", "MATH-500.parquet", 4, "HuggingFaceH4/MATH-500", "test", id_field="unique_id"),
        Benchmark("Minerva", "Minerva.parquet", 4, "math-ai/minervamath", "test", problem_field="question"),
        Benchmark(
            "OlympiadBench",
            "Olympiad-Bench.parquet",
            4,
            "math-ai/olympiadbench",
            "test",
            problem_field="question",
            answer_field="final_answer.0",
            id_field="id",
        ),
    )
}

#: Table 2's benchmark columns, in order; "Avg" is their mean.
PAPER_BENCHMARKS = tuple(BENCHMARKS)


@dataclass(frozen=True)
class Preset:
    """A decoding setting: sampling temperature (0 = greedy) and nucleus top-p."""

    name: str
    temperature: float
    top_p: float

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"preset {self.name}: need temperature >= 0 and 0 < top_p <= 1, got {self}")

    @property
    def label(self) -> str:
        return f"T = {_decimal(self.temperature)}, top-p = {_decimal(self.top_p)}"


def _decimal(value: float) -> str:
    """1 -> "1.0", 0.95 -> "0.95": how the paper writes decoding settings."""
    return f"{value:.1f}" if float(value).is_integer() else f"{value:g}"


#: The paper's two decodings: training-aligned T=1.0 / top-p 1.0, and JustRL's default T=0.7 / top-p 0.9.
PRESETS: dict[str, Preset] = {
    "t1.0": Preset("t1.0", 1.0, 1.0),
    "t0.7": Preset("t0.7", 0.7, 0.9),
}

_PRESET_SPEC = re.compile(r"^t?(?P<t>\d+(?:\.\d*)?)(?:[:,/]p?(?P<p>\d*\.?\d+))?$")


def parse_preset(spec: str | Preset) -> Preset:
    """A `Preset`, a `PRESETS` name (``"t1.0"``), or ``"T:top_p"`` / ``"tT"`` (``"0.6:0.95"``, ``"t0.6"``)."""
    if isinstance(spec, Preset):
        return spec
    if spec in PRESETS:
        return PRESETS[spec]
    match = _PRESET_SPEC.match(spec.strip())
    if match is None:
        raise ValueError(f"unknown decoding preset {spec!r}: use one of {sorted(PRESETS)} or 'T:top_p' (e.g. 0.6:0.95)")
    temperature = float(match["t"])
    top_p = float(match["p"]) if match["p"] else 1.0
    return Preset(f"t{temperature:g}" + ("" if top_p == 1.0 else f"-p{top_p:g}"), temperature, top_p)


def parse_benchmark(spec: str | Benchmark) -> Benchmark:
    """A `Benchmark`, a `BENCHMARKS` name, or ``NAME=SOURCE[,key=value...]`` overriding (or defining) one.

    ``SOURCE`` is a local file / directory or a Hub id; the keys are `Benchmark` fields: ``problem``, ``answer``,
    ``id``, ``split``, ``layout``, ``n`` (num_samples). Examples: ``MATH500=HuggingFaceH4/MATH-500`` (the registry's
    field mapping applies), ``Minerva=data/minerva.jsonl,problem=question,answer=answer``,
    ``GSM8K=openai/gsm8k,problem=question,answer=answer,split=test,n=4`` (a new benchmark).
    """
    if isinstance(spec, Benchmark):
        return spec
    name, has_source, rest = spec.partition("=")
    name = name.strip()
    base = BENCHMARKS.get(name) or _benchmark_by_alias(name)
    if not has_source:
        if base is None:
            raise ValueError(f"unknown benchmark {name!r}: use one of {list(BENCHMARKS)} or NAME=SOURCE")
        return base
    source, *options = [part.strip() for part in rest.split(",")]
    keys = {"problem": "problem_field", "answer": "answer_field", "id": "id_field", "split": "split"}
    changes: dict[str, Any] = {"source": source}
    for option in options:
        key, _, value = option.partition("=")
        if key in keys:
            changes[keys[key]] = value
        elif key == "layout":
            changes["layout"] = value
        elif key in ("n", "num_samples"):
            changes["num_samples"] = int(value)
        else:
            raise ValueError(f"{spec!r}: unknown option {key!r} (problem, answer, id, split, layout, n)")
    return dataclasses.replace(base or Benchmark(name), **changes)


def _benchmark_by_alias(name: str) -> Benchmark | None:
    """Registry lookup ignoring case and punctuation: "math-500", "olympiad-bench", "aime24"."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for benchmark in BENCHMARKS.values():
        aliases = {benchmark.name, benchmark.file.removesuffix(".parquet") if benchmark.file else benchmark.name}
        if key in {re.sub(r"[^a-z0-9]", "", alias.lower()) for alias in aliases}:
            return benchmark
    return None


def load_benchmark(
    benchmark: str | Benchmark, benchmarks_dir: str | os.PathLike | None = None, max_problems: int | None = None
) -> Dataset:
    """The problems of a benchmark as a prompt dataset (`stapo_trl.data` columns: prompt, solution, problem, id...).

    Problem ids are made unique (a repeated id gets ``#<row>``); `max_problems` keeps the first K problems.
    """
    benchmark = parse_benchmark(benchmark)
    source, layout = _benchmark_source(benchmark, benchmarks_dir)
    if layout == "verl":
        dataset = load_verl_parquet(source)
    else:
        dataset = load_math_dataset(
            source,
            benchmark.problem_field,
            benchmark.answer_field,
            split=benchmark.split,
            id_field=benchmark.id_field,
            data_source=benchmark.name,
        )
    if max_problems is not None:
        dataset = dataset.select(range(min(max_problems, len(dataset))))
    ids, seen = [], set()
    for row, problem_id in enumerate(dataset["id"]):
        problem_id = str(problem_id) if problem_id not in seen else f"{problem_id}#{row}"
        seen.add(problem_id)
        ids.append(problem_id)
    return dataset.remove_columns("id").add_column("id", ids)


def _benchmark_source(benchmark: Benchmark, benchmarks_dir: str | os.PathLike | None) -> tuple[str, str]:
    if benchmark.source is not None:
        source = benchmark.source
    elif benchmarks_dir is not None:
        if benchmark.file is None:
            raise ValueError(f"benchmark {benchmark.name} has no file name; give it a source")
        path = Path(benchmarks_dir).expanduser() / benchmark.file
        if not path.exists():
            raise FileNotFoundError(
                f"benchmark {benchmark.name}: no file {path}. Set the benchmarks directory to the one holding "
                f"{benchmark.file}, or give the benchmark a source (NAME=PATH_OR_HUB_ID)."
            )
        source = str(path)
    elif benchmark.hub_id is not None:
        source = benchmark.hub_id
    else:
        raise ValueError(f"benchmark {benchmark.name}: no source, no benchmarks directory and no Hub id")
    layout = benchmark.layout
    if layout == "auto":
        local = Path(source).expanduser()
        is_parquet = local.is_dir() or local.name.lower().endswith(".parquet")
        layout = "verl" if local.exists() and is_parquet else "fields"
    return source, layout


# ---------------------------------------------------------------------------------------------------------------
# Grading: the training reward, one code path
# ---------------------------------------------------------------------------------------------------------------


def grade_completions(
    completions: Sequence[str], golds: Sequence[str], verification_timeout: float | None = None
) -> list[dict[str, Any]]:
    """Grade completions against gold answers with `math_reward`, the training reward (+1.0 = correct).

    Returns one dict per completion: ``extracted_answer`` (the last ``\\boxed{}``'s content, or None), ``correct``
    (bool) and ``grading``: ``"math_verify"``, or ``"exact_match"`` for the few golds math-verify cannot parse
    (``math_reward`` scores those None; here the boxed answer must then equal the gold up to whitespace and ``$``,
    so that every problem stays gradable and no problem leaves the denominator).
    """
    if not completions:
        return []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="math_reward: row")  # unparseable golds: handled below
        rewards = math_reward(list(completions), list(golds), verification_timeout=verification_timeout)
    results = []
    for completion, gold, reward in zip(completions, golds, rewards):
        answer = extract_boxed_answer(completion)
        if reward is None:
            correct = answer is not None and _normalized(answer) == _normalized(_gold_answer(gold))
            results.append({"extracted_answer": answer, "correct": correct, "grading": "exact_match"})
        else:
            results.append({"extracted_answer": answer, "correct": reward == 1.0, "grading": "math_verify"})
    return results


def _gold_answer(gold: str) -> str:
    boxed = extract_boxed_answer(gold)
    return gold if boxed is None else boxed


def _normalized(answer: str) -> str:
    return re.sub(r"\s+", "", answer).strip("$").rstrip(".")


# ---------------------------------------------------------------------------------------------------------------
# Generation with per-sample seeds
# ---------------------------------------------------------------------------------------------------------------


def sample_seed(base_seed: int, *parts: Any) -> int:
    """A 31-bit seed for one sample, from the run's seed and what names the sample (benchmark, problem, index)."""
    digest = hashlib.sha256("\x1f".join(map(str, (base_seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class SeededSampler(LogitsProcessor):
    """Sampling with one random generator per batch row, for greedy-mode ``generate``.

    Applies the temperature and the top-p filter, then adds Gumbel noise drawn from the row's own generator; the
    greedy argmax of the result is an exact sample from the filtered distribution (Gumbel-max trick). Row ``i``'s
    noise at step ``t`` depends only on ``seeds[i]`` and ``t``, so a sample is the same whatever batch it is in.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float):
        if temperature <= 0:
            raise ValueError("SeededSampler samples: temperature must be > 0 (greedy decoding needs no sampler)")
        self.seeds = [int(seed) for seed in seeds]
        self.temperature = temperature
        self.top_p = top_p
        self.generators: list[torch.Generator] | None = None  # made on the device of the logits, at the first step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.generators is None:
            if len(self.seeds) != scores.shape[0]:
                raise ValueError(f"{len(self.seeds)} seeds for a batch of {scores.shape[0]} rows")
            self.generators = [torch.Generator(device=scores.device).manual_seed(seed) for seed in self.seeds]
        scores = scores.float() / self.temperature
        if self.top_p < 1.0:
            sorted_scores, sorted_indices = torch.sort(scores, descending=False)
            cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
            remove = cumulative <= (1 - self.top_p)
            remove[..., -1:] = False  # keep at least the most likely token
            scores = scores.masked_fill(remove.scatter(1, sorted_indices, remove), -math.inf)
        noise = torch.stack(
            [
                torch.empty(scores.shape[-1], device=scores.device).exponential_(generator=generator)
                for generator in self.generators
            ]
        )
        return scores - noise.log()  # argmax(s - log E), E ~ Exp(1): a sample from softmax(s)


@dataclass
class Generation:
    """One completion: its text, its length in tokens (the EOS token included) and why it ended."""

    text: str
    num_tokens: int
    finish_reason: str  # "stop" (EOS) or "length" (max_new_tokens reached)


def _chat_texts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[dict]]) -> list[str]:
    if getattr(tokenizer, "chat_template", None) is None:
        logger.warning("the tokenizer has no chat template: the prompts are given as plain text")
        return [prompt[-1]["content"] for prompt in prompts]
    return tokenizer.apply_chat_template(list(prompts), tokenize=False, add_generation_prompt=True)


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


@torch.no_grad()
def generate_seeded(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[dict]],
    seeds: Sequence[int],
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 1024,
) -> list[Generation]:
    """One transformers ``generate`` call over a batch of conversational prompts, one seed per prompt.

    ``temperature=0`` decodes greedily. The global torch RNG is neither used nor changed; the model is put in eval
    mode for the call and restored. Prompts are left-padded and tokenized without extra special tokens, like TRL.
    """
    if len(prompts) != len(seeds):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    was_training = model.training
    model.eval()
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        texts = _chat_texts(tokenizer, prompts)
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        eos_ids = _eos_token_ids(model, tokenizer)
        processors = [SeededSampler(seeds, temperature, top_p)] if temperature > 0 else []
        output = model.generate(
            **batch,
            do_sample=False,
            logits_processor=processors,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_ids,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0],
            repetition_penalty=1.0,
            use_cache=True,
        )
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    new_tokens = output[:, batch["input_ids"].shape[1] :].tolist()
    generations = []
    for row in new_tokens:
        end = next((position for position, token in enumerate(row) if token in eos_ids), None)
        tokens = row if end is None else row[: end + 1]
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        generations.append(Generation(text, len(tokens), "length" if end is None else "stop"))
    return generations


def generate_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[dict]],
    *,
    num_samples: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 1024,
    batch_size: int = 64,
    seed: int = 0,
) -> list[list[str]]:
    """Sample `num_samples` completions for every conversational prompt with transformers `generate`, batched.

    Returns one list of completion texts per prompt. Sample ``j`` of prompt ``i`` is seeded with
    ``sample_seed(seed, i, j)``, so a call is reproducible on one device whatever the batch size, and the global
    torch RNG is left alone.
    """
    requests = [(prompt, sample_seed(seed, i, j)) for i, prompt in enumerate(prompts) for j in range(num_samples)]
    texts = []
    for start in range(0, len(requests), batch_size):
        chunk = requests[start : start + batch_size]
        generations = generate_seeded(
            model,
            tokenizer,
            [prompt for prompt, _ in chunk],
            [seed for _, seed in chunk],
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
        )
        texts.extend(generation.text for generation in generations)
    return [texts[i * num_samples : (i + 1) * num_samples] for i in range(len(prompts))]


def sampled_accuracy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dataset: Dataset, num_samples: int = 1, **generation
) -> float:
    """Mean correctness (avg@num_samples) over a prompt dataset with `prompt` and `solution` columns.

    Graded with `grade_completions` (the training reward, `math_reward`): +1 counts as correct. `generation` goes
    to `generate_completions`.
    """
    completions = generate_completions(model, tokenizer, dataset["prompt"], num_samples=num_samples, **generation)
    flat_completions = [text for samples in completions for text in samples]
    solutions = [solution for solution in dataset["solution"] for _ in range(num_samples)]
    grades = grade_completions(flat_completions, solutions)
    return sum(grade["correct"] for grade in grades) / len(grades) if grades else math.nan


def load_model_for_evaluation(path: str, **model_kwargs) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a Hub id or local checkpoint, or a PEFT adapter directory (with its base model), and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (Path(path) / "adapter_config.json").is_file():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(path, **model_kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, **model_kwargs)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


class TransformersBackend:
    """Generation with transformers ``generate`` (any device, tiny models on CPU included)."""

    name = "transformers"
    default_batch_size = 16

    def __init__(self, model_path: str, dtype: str = "auto"):
        self.model, self.tokenizer = load_model_for_evaluation(model_path, dtype=dtype)
        if torch.cuda.is_available() and self.model.device.type == "cpu":
            self.model.to("cuda")

    def generate(self, prompts, seeds, *, temperature, top_p, max_new_tokens) -> list[Generation]:
        return generate_seeded(
            self.model,
            self.tokenizer,
            prompts,
            seeds,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
        )


class VLLMBackend:
    """Generation with vLLM (imported here only): one request per sample, with the sample's seed.

    A PEFT adapter directory is served as a LoRA on its base model (``adapter_config.json``'s
    ``base_model_name_or_path``). `vllm_kwargs` go to ``vllm.LLM`` (``tensor_parallel_size``,
    ``gpu_memory_utilization``, ``max_model_len``...).
    """

    name = "vllm"
    default_batch_size = 1024

    def __init__(self, model_path: str, dtype: str = "auto", seed: int = 0, **vllm_kwargs):
        from vllm import LLM, SamplingParams

        self._sampling_params = SamplingParams
        self.lora_request = None
        kwargs = {"dtype": dtype, "seed": seed, **vllm_kwargs}
        adapter_config = Path(model_path) / "adapter_config.json"
        if adapter_config.is_file():
            from vllm.lora.request import LoRARequest

            adapter = json.loads(adapter_config.read_text())
            kwargs = {"enable_lora": True, "max_lora_rank": adapter.get("r", 16), **kwargs}
            self.llm = LLM(model=adapter["base_model_name_or_path"], tokenizer=model_path, **kwargs)
            self.lora_request = LoRARequest("adapter", 1, str(model_path))
        else:
            self.llm = LLM(model=model_path, **kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts, seeds, *, temperature, top_p, max_new_tokens) -> list[Generation]:
        texts = _chat_texts(self.tokenizer, prompts)
        inputs = [{"prompt_token_ids": self.tokenizer(text, add_special_tokens=False)["input_ids"]} for text in texts]
        params = [
            self._sampling_params(n=1, seed=seed, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens)
            for seed in seeds
        ]
        outputs = self.llm.generate(inputs, params, lora_request=self.lora_request, use_tqdm=False)
        return [
            Generation(out.outputs[0].text, len(out.outputs[0].token_ids), out.outputs[0].finish_reason or "stop")
            for out in outputs
        ]


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def make_backend(model_path: str, config: EvalConfig):
    """The generation backend of `config`: ``"vllm"``, ``"transformers"`` or ``"auto"`` (vLLM when usable)."""
    backend = config.backend
    if backend == "auto":
        backend = "vllm" if vllm_available() else "transformers"
    if backend == "vllm":
        return VLLMBackend(model_path, dtype=config.dtype, seed=config.seed, **config.vllm_kwargs)
    if backend == "transformers":
        return TransformersBackend(model_path, dtype=config.dtype)
    raise ValueError(f"unknown backend {config.backend!r}: 'auto', 'vllm' or 'transformers'")


# ---------------------------------------------------------------------------------------------------------------
# The evaluation run
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class EvalConfig:
    """What `evaluate` measures and how. The defaults are the paper's protocol.

    Attributes:
        output_dir: where ``samples.jsonl``, ``run.json``, ``summary.json`` and ``summary.md`` go (one model per
            directory). Rerunning with the same directory resumes.
        benchmarks_dir: a directory of veRL-layout parquet files named as in `BENCHMARKS` (e.g.
            ``shared/data/math_eval``); None = each benchmark's Hub dataset.
        benchmarks: names of `BENCHMARKS`, ``NAME=SOURCE,...`` specs (`parse_benchmark`) or `Benchmark` objects.
        num_samples: samples per problem: one number for every benchmark, or ``{name: n}``; None = the registry's
            (32 for AIME24/AIME25/AMC23, 4 for the others).
        presets: `PRESETS` names, ``"T:top_p"`` specs or `Preset` objects.
        max_new_tokens: generation limit (paper: 20,480).
        max_problems: evaluate only the first K problems of each benchmark (smoke runs).
        batch_size: requests per generation call (default: 16 with transformers, 1024 with vLLM).
        seed: the run's seed; each sample's seed derives from it (`sample_seed`).
        backend: ``"auto"`` (vLLM if installed and a GPU is present), ``"vllm"`` or ``"transformers"``.
        dtype: model dtype (``"auto"``: the checkpoint's).
        model_name: the model's row name in tables (default: derived from the path).
        overwrite: discard the samples already in `output_dir` instead of resuming.
        retry_errors: regenerate samples recorded with an error when resuming.
        verification_timeout: seconds per answer for `math_reward` (default: its own, 5 s).
        vllm_kwargs: extra ``vllm.LLM`` arguments.
    """

    output_dir: str
    benchmarks_dir: str | None = None
    benchmarks: Sequence[str | Benchmark] = PAPER_BENCHMARKS
    num_samples: int | Mapping[str, int] | None = None
    presets: Sequence[str | Preset] = tuple(PRESETS)
    max_new_tokens: int = 20480
    max_problems: int | None = None
    batch_size: int | None = None
    seed: int = 0
    backend: str = "auto"
    dtype: str = "auto"
    model_name: str | None = None
    overwrite: bool = False
    retry_errors: bool = True
    verification_timeout: float | None = None
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)


def model_display_name(model_path: str) -> str:
    """A short row name: a Hub id as is, a local path as its last two components (``run/checkpoint-500``)."""
    path = Path(model_path)
    if not path.exists():
        return model_path
    parts = path.resolve().parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else str(path)


def _num_samples(benchmark: Benchmark, num_samples: int | Mapping[str, int] | None) -> int:
    if num_samples is None:
        return benchmark.num_samples
    if isinstance(num_samples, Mapping):
        return int(num_samples.get(benchmark.name, benchmark.num_samples))
    return int(num_samples)


def _key(record: Mapping[str, Any]) -> tuple[str, str, str, int]:
    return (record["benchmark"], record["preset"], str(record["problem_id"]), int(record["sample_index"]))


def read_samples(path: str | os.PathLike, repair: bool = False) -> list[dict[str, Any]]:
    """The records of a samples file, in order; a torn (half-written) line is skipped with a warning.

    With `repair`, a torn last line is cut off the file (or completed with its newline when it is whole JSON), so
    that the next append starts on a fresh line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    if repair and data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
            with open(path, "ab") as file:
                file.write(b"\n")
        except ValueError:
            logger.warning("%s: dropping a half-written last line (%d bytes)", path, len(data) - cut)
            with open(path, "r+b") as file:
                file.truncate(cut)
            data = data[:cut]
    records = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            _key(record)
        except (ValueError, KeyError, TypeError):
            logger.warning("%s: line %d is not a sample record; skipped", path, number)
            continue
        records.append(record)
    return records


def _latest(records: Iterable[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """One record per sample: the last one written."""
    return {_key(record): record for record in records}


@dataclass
class _Plan:
    """What a run measures: benchmarks (with their problems and avg@N) and presets."""

    benchmarks: dict[str, dict[str, Any]]  # name -> {"num_samples", "problem_ids", "source"}
    presets: list[Preset]

    def to_json(self) -> dict[str, Any]:
        return {"benchmarks": self.benchmarks, "presets": [dataclasses.asdict(preset) for preset in self.presets]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _Plan:
        return cls(dict(data["benchmarks"]), [Preset(**preset) for preset in data["presets"]])


def evaluate(model_path: str, config: EvalConfig) -> dict[str, Any]:
    """Evaluate a model (Hub id, local checkpoint or PEFT adapter directory) as the paper does; resumable.

    Loads the problems, skips the samples already in ``<output_dir>/samples.jsonl`` (same benchmark, preset,
    problem id and sample index, generated with the same decoding), generates the rest with the backend, grades
    each batch with `grade_completions` and appends its records at once. Returns the summary (`summarize`), also
    written to ``summary.json`` and ``summary.md``.

    Raises `ValueError` when `output_dir` holds samples of another model or generated with another
    ``max_new_tokens`` / seed / prompt (use another directory, or ``overwrite=True``).
    """
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    samples_path = output_dir / SAMPLES_FILE
    benchmarks = [parse_benchmark(benchmark) for benchmark in config.benchmarks]
    presets = [parse_preset(preset) for preset in config.presets]
    problems = {
        benchmark.name: load_benchmark(benchmark, config.benchmarks_dir, config.max_problems)
        for benchmark in benchmarks
    }
    plan = _Plan(
        {
            benchmark.name: {
                "num_samples": _num_samples(benchmark, config.num_samples),
                "problem_ids": list(problems[benchmark.name]["id"]),
                "source": _benchmark_source(benchmark, config.benchmarks_dir)[0],
            }
            for benchmark in benchmarks
        },
        presets,
    )
    settings = {
        "model": str(Path(model_path).resolve()) if Path(model_path).exists() else model_path,
        "max_new_tokens": config.max_new_tokens,
        "seed": config.seed,
        "instruction": MATH_INSTRUCTION,
    }
    _check_run_settings(output_dir, settings, config.overwrite)
    if config.overwrite and samples_path.exists():
        samples_path.unlink()
    model_name = config.model_name or model_display_name(model_path)
    run = {"model_name": model_name, "settings": settings, "plan": plan.to_json()}
    (output_dir / RUN_FILE).write_text(json.dumps(run, indent=2, ensure_ascii=False))

    done = _latest(read_samples(samples_path, repair=True))
    requests = []
    for preset in presets:
        for benchmark in benchmarks:
            dataset = problems[benchmark.name]
            for problem_id, prompt, gold in zip(dataset["id"], dataset["prompt"], dataset["solution"]):
                for index in range(plan.benchmarks[benchmark.name]["num_samples"]):
                    record = done.get((benchmark.name, preset.name, problem_id, index))
                    if record is not None and _is_done(record, preset, config.retry_errors):
                        continue
                    seed = sample_seed(config.seed, benchmark.name, problem_id, index)
                    requests.append(_Request(benchmark.name, preset, problem_id, index, prompt, gold, seed))
    total = len(presets) * sum(len(spec["problem_ids"]) * spec["num_samples"] for spec in plan.benchmarks.values())
    logger.info("%s: %d of %d samples to generate (%s)", model_name, len(requests), total, output_dir)
    if requests:
        backend = make_backend(model_path, config)
        try:
            batch_size = config.batch_size or backend.default_batch_size
            _run_requests(backend, requests, batch_size, samples_path, config)
        finally:  # free the device for the next model of the same process
            del backend
            import gc

            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return summarize(output_dir)


@dataclass
class _Request:
    benchmark: str
    preset: Preset
    problem_id: str
    sample_index: int
    prompt: list[dict]
    gold: str
    seed: int


def _is_done(record: Mapping[str, Any], preset: Preset, retry_errors: bool) -> bool:
    same_decoding = record.get("temperature") == preset.temperature and record.get("top_p") == preset.top_p
    return same_decoding and not (retry_errors and record.get("error"))


def _check_run_settings(output_dir: Path, settings: dict[str, Any], overwrite: bool) -> None:
    run_path = output_dir / RUN_FILE
    if overwrite or not run_path.is_file() or not (output_dir / SAMPLES_FILE).is_file():
        return
    previous = json.loads(run_path.read_text()).get("settings", {})
    different = {key: (previous.get(key), value) for key, value in settings.items() if previous.get(key) != value}
    if different:
        details = ", ".join(f"{key}: {old!r} there, {new!r} now" for key, (old, new) in different.items())
        raise ValueError(
            f"{output_dir} holds samples of another run ({details}). Use another output directory, or overwrite it."
        )


def _run_requests(backend, requests: list[_Request], batch_size: int, samples_path: Path, config: EvalConfig):
    """Generate, grade and append the records of `requests`, batch by batch (one preset and benchmark per batch)."""
    batches, current = [], []
    for request in requests:
        if current and (
            len(current) == batch_size
            or (request.benchmark, request.preset) != (current[0].benchmark, current[0].preset)
        ):
            batches.append(current)
            current = []
        current.append(request)
    if current:
        batches.append(current)
    written = 0
    started = time.monotonic()
    with open(samples_path, "a", encoding="utf-8") as file:
        for batch in batches:
            records = _generate_and_grade(backend, batch, config)
            file.write("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
            file.flush()
            os.fsync(file.fileno())
            written += len(records)
            logger.info(
                "%s %s: %d/%d samples done (%.0f s)",
                batch[0].benchmark,
                batch[0].preset.name,
                written,
                len(requests),
                time.monotonic() - started,
            )


def _generate_and_grade(backend, batch: list[_Request], config: EvalConfig) -> list[dict[str, Any]]:
    """The records of one batch. A failing batch is retried one request at a time; what still fails is recorded
    with its error instead of stopping the run."""
    preset = batch[0].preset
    try:
        generations = backend.generate(
            [request.prompt for request in batch],
            [request.seed for request in batch],
            temperature=preset.temperature,
            top_p=preset.top_p,
            max_new_tokens=config.max_new_tokens,
        )
        if len(generations) != len(batch):
            raise RuntimeError(f"the backend returned {len(generations)} completions for {len(batch)} prompts")
    except Exception as error:
        if len(batch) > 1:
            logger.warning("generation failed for a batch of %d (%r); retrying one by one", len(batch), error)
            return [record for request in batch for record in _generate_and_grade(backend, [request], config)]
        logger.warning("generation failed for %s: %r", batch[0], error)
        return [_record(batch[0], backend.name, None, error=f"generation: {type(error).__name__}: {error}")]
    try:
        grades = grade_completions(
            [generation.text for generation in generations],
            [request.gold for request in batch],
            verification_timeout=config.verification_timeout,
        )
    except Exception as error:
        logger.warning("grading failed for a batch of %d: %r", len(batch), error)
        message = f"grading: {type(error).__name__}: {error}"
        return [_record(r, backend.name, g, error=message) for r, g in zip(batch, generations)]
    return [_record(r, backend.name, g, grade) for r, g, grade in zip(batch, generations, grades)]


def _record(
    request: _Request,
    backend: str,
    generation: Generation | None,
    grade: Mapping[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    return {
        "benchmark": request.benchmark,
        "preset": request.preset.name,
        "problem_id": request.problem_id,
        "sample_index": request.sample_index,
        "completion": generation.text if generation else None,
        "extracted_answer": grade["extracted_answer"] if grade else None,
        "correct": grade["correct"] if grade else None,
        "grading": grade["grading"] if grade else None,
        "gold": request.gold,
        "num_tokens": generation.num_tokens if generation else None,
        "finish_reason": generation.finish_reason if generation else None,
        "temperature": request.preset.temperature,
        "top_p": request.preset.top_p,
        "seed": request.seed,
        "backend": backend,
        "error": error,
    }


def regrade(output_dir: str | os.PathLike, verification_timeout: float | None = None) -> dict[str, Any]:
    """Grade every stored completion of a run again (no generation), rewrite the samples file, and summarise.

    Records whose grading had failed get graded; records whose generation had failed stay as they are. The file is
    rewritten atomically with one record per sample (the latest).
    """
    output_dir = Path(output_dir)
    samples_path = output_dir / SAMPLES_FILE
    records = list(_latest(read_samples(samples_path)).values())
    by_benchmark: dict[str, list[dict]] = {}
    for record in records:
        if record.get("completion") is not None:
            by_benchmark.setdefault(record["benchmark"], []).append(record)
    for benchmark_records in by_benchmark.values():
        grades = grade_completions(
            [record["completion"] for record in benchmark_records],
            [record["gold"] for record in benchmark_records],
            verification_timeout=verification_timeout,
        )
        for record, grade in zip(benchmark_records, grades):
            record.update(grade)
            if (record.get("error") or "").startswith("grading"):
                record["error"] = None
    temporary = samples_path.with_suffix(".jsonl.tmp")
    temporary.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
    os.replace(temporary, samples_path)
    return summarize(output_dir)


def summarize(output_dir: str | os.PathLike) -> dict[str, Any]:
    """Summarise a run directory from its records and its plan (``run.json``); write summary.json / summary.md.

    avg@N of a benchmark = mean over its problems of the fraction of correct samples, in percent (as the paper).
    A sample whose generation failed counts as incorrect (``num_errors`` says how many); missing samples (a run
    still in progress) are left out and the result is marked ``complete: false``. ``avg`` is the mean over the
    paper's six benchmarks (``avg_over`` names those present when some are missing); ``mean_response_length`` is
    the mean completion length in tokens, per benchmark and averaged over the benchmarks.
    """
    output_dir = Path(output_dir)
    run = json.loads((output_dir / RUN_FILE).read_text())
    plan = _Plan.from_json(run["plan"])
    records = _latest(read_samples(output_dir / SAMPLES_FILE))
    summary = {"model": run["model_name"], "model_path": run["settings"]["model"], "settings": run["settings"]}
    summary["results"] = {}
    for preset in plan.presets:
        per_benchmark = {}
        for name, spec in plan.benchmarks.items():
            per_benchmark[name] = _benchmark_result(records, name, preset, spec["problem_ids"], spec["num_samples"])
        summary["results"][preset.name] = {
            "temperature": preset.temperature,
            "top_p": preset.top_p,
            "benchmarks": per_benchmark,
            **_averages(per_benchmark),
        }
    (output_dir / SUMMARY_JSON).write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    (output_dir / SUMMARY_MD).write_text(markdown_table({summary["model"]: summary}))
    return summary


def _benchmark_result(records, name: str, preset: Preset, problem_ids: list[str], num_samples: int) -> dict:
    problem_scores, lengths = [], []
    done = errors = exact_match = truncated = 0
    for problem_id in problem_ids:
        correct = []
        for index in range(num_samples):
            record = records.get((name, preset.name, problem_id, index))
            if record is None or not _is_done(record, preset, retry_errors=False):
                continue
            done += 1
            if record.get("correct") is None:  # failed generation or grading
                errors += 1
                correct.append(False)
                continue
            correct.append(bool(record["correct"]))
            exact_match += record.get("grading") == "exact_match"
            if record.get("num_tokens") is not None:
                lengths.append(record["num_tokens"])
                truncated += record.get("finish_reason") == "length"
        if correct:
            problem_scores.append(sum(correct) / len(correct))
    expected = len(problem_ids) * num_samples
    return {
        "metric": f"avg@{num_samples}",
        "score": 100 * sum(problem_scores) / len(problem_scores) if problem_scores else None,
        "num_problems": len(problem_ids),
        "num_samples": num_samples,
        "num_done": done,
        "num_errors": errors,
        "num_exact_match_graded": exact_match,
        "complete": done == expected and errors == 0,
        "mean_response_length": sum(lengths) / len(lengths) if lengths else None,
        "truncated_fraction": truncated / len(lengths) if lengths else None,
    }


def _averages(per_benchmark: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    paper = [name for name in PAPER_BENCHMARKS if per_benchmark.get(name, {}).get("score") is not None]
    lengths = [r["mean_response_length"] for r in per_benchmark.values() if r["mean_response_length"] is not None]
    return {
        "avg": sum(per_benchmark[name]["score"] for name in paper) / len(paper) if paper else None,
        "avg_over": paper,
        "complete": len(paper) == len(PAPER_BENCHMARKS) and all(r["complete"] for r in per_benchmark.values()),
        "mean_response_length": sum(lengths) / len(lengths) if lengths else None,
    }


# ---------------------------------------------------------------------------------------------------------------
# Table 2 layout
# ---------------------------------------------------------------------------------------------------------------


def markdown_table(summaries: Mapping[str, Mapping[str, Any]], digits: int = 2) -> str:
    """Markdown tables laid out like the paper's Table 2: one block per decoding preset, a row per model.

    Columns: AIME24, AIME25, AMC23, MATH500, Minerva, OlympiadBench, Avg (then any other benchmark evaluated, and
    the mean response length in tokens). ``–`` marks a benchmark not evaluated; ``*`` a partial result (samples
    missing or failed, or Avg over fewer than the six benchmarks).
    """
    presets: dict[str, Mapping[str, Any]] = {}
    extra: list[str] = []
    for summary in summaries.values():
        for preset_name, result in summary["results"].items():
            presets.setdefault(preset_name, result)
            extra += [name for name in result["benchmarks"] if name not in PAPER_BENCHMARKS and name not in extra]
    columns = [*PAPER_BENCHMARKS, "Avg", *extra, "Mean length"]
    blocks, partial = [], False
    for preset_name, first in presets.items():
        lines = [
            f"**{Preset(preset_name, first['temperature'], first['top_p']).label}** (`{preset_name}`)",
            "",
            "| Model | " + " | ".join(columns) + " |",
            "|---|" + "---:|" * len(columns),
        ]
        for model_name, summary in summaries.items():
            result = summary["results"].get(preset_name)
            cells = []
            for column in columns:
                value, complete = _cell(result, column)
                cells.append("–" if value is None else f"{value:.{digits if column != 'Mean length' else 0}f}")
                if value is not None and not complete:
                    cells[-1] += "*"
                    partial = True
            lines.append(f"| {model_name} | " + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    metrics = {
        name: result["benchmarks"][name]["metric"]
        for summary in summaries.values()
        for result in summary["results"].values()
        for name in result["benchmarks"]
    }
    notes = ["Scores: " + ", ".join(f"{name} {metric}" for name, metric in metrics.items()) + " (%)."]
    notes.append("Mean length: mean response length in tokens, averaged over the benchmarks.")
    if partial:
        notes.append("\\* partial: samples missing or failed, or Avg over fewer than the six benchmarks.")
    return "\n\n".join(blocks) + "\n\n" + " ".join(notes) + "\n"


def _cell(result: Mapping[str, Any] | None, column: str) -> tuple[float | None, bool]:
    if result is None:
        return None, True
    if column == "Avg":
        return result["avg"], result["complete"]
    if column == "Mean length":
        return result["mean_response_length"], True
    benchmark = result["benchmarks"].get(column)
    if benchmark is None:
        return None, True
    return benchmark["score"], benchmark["complete"]


# ---------------------------------------------------------------------------------------------------------------
# During training
# ---------------------------------------------------------------------------------------------------------------


class BenchmarkEvalCallback(TrainerCallback):
    """avg@k on one benchmark every `every_n_steps` optimizer steps, logged as ``eval/<benchmark>/avg@<k>``.

    For the accuracy-over-training curves (paper Fig. 5a). Generation uses the current policy with transformers
    ``generate`` and the per-sample seeds of `evaluate` (the same seeds at every evaluation, so the curve's steps
    differ by the model, not by the sampling noise); grading uses `grade_completions`.

    Every process takes part: the samples are split into equal shards, each process generates its shard with the
    same number of ``generate`` calls (needed under FSDP / ZeRO-3, where every forward pass is collective), and the
    results are gathered, so all processes log the same numbers and none waits on a collective the others skip.
    Pass the trainer (``trainer.add_callback(BenchmarkEvalCallback(..., trainer=trainer))``) so that the model is
    unwrapped as TRL does for its own generation and the metric reaches the trainer's loggers (``on_log``) and
    ``trainer_state.json``; without it the metric is only appended to ``state.log_history``.
    """

    def __init__(
        self,
        benchmark: str | Benchmark = "AIME24",
        *,
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
        self.benchmark = parse_benchmark(benchmark)
        self.problems = load_benchmark(self.benchmark, benchmarks_dir, max_problems)
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
        import contextlib

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
            (problem_id, prompt, gold, sample_seed(self.seed, self.benchmark.name, problem_id, index))
            for problem_id, prompt, gold in zip(self.problems["id"], self.problems["prompt"], self.problems["solution"])
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
        grades = grade_completions([texts[i] for i in generated], [shard[i][2] for i in generated])
        correct = [False] * real
        for i, grade in zip(generated, grades):
            correct[i] = grade["correct"]
        local = [(problem_id, correct[i], lengths[i]) for i, (problem_id, _, _, _) in enumerate(shard)]
        if not distributed:
            return local
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, local)
        return [item for part in gathered for item in part]
