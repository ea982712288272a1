"""Generation and grading of math problems: sampled accuracy of a model, graded like training (`math_reward`)."""

import math

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .rewards import math_reward


@torch.no_grad()
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

    Returns one list of completion texts per prompt. Sampling is seeded, so a call is reproducible on one device.
    """
    was_training = model.training
    model.eval()
    texts = tokenizer.apply_chat_template(prompts, tokenize=False, add_generation_prompt=True)
    requests = [text for text in texts for _ in range(num_samples)]
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    completions = []
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"  # generation continues on the right
    try:
        for start in range(0, len(requests), batch_size):
            batch = tokenizer(requests[start : start + batch_size], return_tensors="pt", padding=True).to(model.device)
            output = model.generate(
                **batch,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_p=top_p,
                top_k=0,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
            new_tokens = output[:, batch["input_ids"].shape[1] :]
            completions.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
    finally:
        tokenizer.padding_side = padding_side
        torch.random.set_rng_state(generator_state)
        model.train(was_training)
    return [completions[i * num_samples : (i + 1) * num_samples] for i in range(len(prompts))]


def sampled_accuracy(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dataset: Dataset, num_samples: int = 1, **generation
) -> float:
    """Mean correctness (avg@num_samples) over a prompt dataset with `prompt` and `solution` columns.

    Graded with `math_reward`, the training reward: +1 counts as correct. Rows whose gold answer cannot be parsed
    (reward None) are left out. `generation` goes to `generate_completions`.
    """
    completions = generate_completions(model, tokenizer, dataset["prompt"], num_samples=num_samples, **generation)
    flat_completions = [text for samples in completions for text in samples]
    solutions = [solution for solution in dataset["solution"] for _ in range(num_samples)]
    rewards = [r for r in math_reward(flat_completions, solutions) if r is not None]
    return sum(r == 1.0 for r in rewards) / len(rewards) if rewards else math.nan


def load_model_for_evaluation(path: str, **model_kwargs) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a Hub id or local checkpoint, or a PEFT adapter directory (with its base model), and its tokenizer."""
    from pathlib import Path

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
