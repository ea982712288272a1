"""Supervised pretraining of the toy model: a tiny Qwen3 that is *partly* good at the synthetic arithmetic.

The model is taught, on the exact chat-formatted prompt it sees during RL, to answer with one line of reasoning and
a boxed answer. Training stops early on purpose: the result answers many held-out problems correctly when decoding
greedily but is unsure when sampling at temperature 1.0, which leaves RL something to improve.

    python -m stapo_trl.toy.pretrain --output_dir DIR
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

from .problems import Problem, chat_prompt, generate_problems, is_correct

# Defaults used for the shipped checkpoint (see `stapo_trl/toy/checkpoint/pretrain_config.json`).
DEFAULTS = dict(
    hidden_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    steps=600,
    batch_size=64,
    lr=3e-3,
    warmup_steps=30,
    weight_decay=0.01,
    seed=0,
)


def _encode_batch(tokenizer, problems: list[Problem]):
    """Right-padded input ids, attention mask and labels (-100 except on the completion and its EOS)."""
    import torch

    rows, label_rows = [], []
    for problem in problems:
        prompt_ids = tokenizer(chat_prompt(tokenizer, problem), add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(problem.completion, add_special_tokens=False)["input_ids"] + [
            tokenizer.eos_token_id
        ]
        rows.append(prompt_ids + completion_ids)
        label_rows.append([-100] * len(prompt_ids) + completion_ids)
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    for i, (row, label_row) in enumerate(zip(rows, label_rows)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
        labels[i, : len(row)] = torch.tensor(label_row)
    return input_ids, attention_mask, labels


def evaluate(
    model,
    tokenizer,
    problems: list[Problem],
    do_sample: bool = False,
    temperature: float = 1.0,
    num_samples: int = 1,
    batch_size: int = 256,
    max_new_tokens: int = 32,
    seed: int = 0,
) -> float:
    """Fraction of (problem, sample) pairs whose last boxed answer is exactly right, generating with `generate`."""
    import torch

    was_training = model.training
    model.eval()
    correct = total = 0
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            prompts = [chat_prompt(tokenizer, p) for p in chunk]
            batch = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
            kwargs = dict(temperature=temperature, top_k=0, top_p=1.0) if do_sample else {}
            out = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                num_return_sequences=num_samples,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                do_sample=do_sample,
                **kwargs,
            )
            texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
            for i, text in enumerate(texts):
                correct += is_correct(text, chunk[i // num_samples].answer)
                total += 1
    model.train(was_training)
    return correct / total


def pretrain(
    model,
    tokenizer,
    steps: int = DEFAULTS["steps"],
    batch_size: int = DEFAULTS["batch_size"],
    lr: float = DEFAULTS["lr"],
    warmup_steps: int = DEFAULTS["warmup_steps"],
    weight_decay: float = DEFAULTS["weight_decay"],
    seed: int = DEFAULTS["seed"],
    log_every: int = 50,
    eval_every: int = 0,
    eval_problems: list[Problem] | None = None,
    log=print,
) -> list[dict]:
    """Train `model` in place on freshly drawn train-split problems; return the log records.

    AdamW, linear warmup then cosine decay to 10% of `lr`, loss on completion tokens only. Deterministic for a
    given `seed` on a given machine (problems are drawn with `random.Random(seed)`, torch is seeded).
    """
    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return lr * (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    records = []
    start = time.perf_counter()
    for step in range(steps):
        problems = generate_problems(batch_size, seed=rng.getrandbits(32), split="train", unique=False)
        input_ids, attention_mask, labels = _encode_batch(tokenizer, problems)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        record = {"step": step + 1, "loss": loss.item(), "seconds": time.perf_counter() - start}
        if eval_every and eval_problems and (step + 1) % eval_every == 0:
            record["greedy_acc"] = evaluate(model, tokenizer, eval_problems)
            record["sampled_acc"] = evaluate(model, tokenizer, eval_problems, do_sample=True)
        records.append(record)
        if log and ((step + 1) % log_every == 0 or "greedy_acc" in record or step + 1 == steps):
            log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()))
    model.eval()
    return records


def build_toy_checkpoint(
    output_dir: str | Path,
    hidden_size: int = DEFAULTS["hidden_size"],
    num_hidden_layers: int = DEFAULTS["num_hidden_layers"],
    num_attention_heads: int = DEFAULTS["num_attention_heads"],
    num_key_value_heads: int = DEFAULTS["num_key_value_heads"],
    intermediate_size: int = DEFAULTS["intermediate_size"],
    steps: int = DEFAULTS["steps"],
    batch_size: int = DEFAULTS["batch_size"],
    lr: float = DEFAULTS["lr"],
    warmup_steps: int = DEFAULTS["warmup_steps"],
    weight_decay: float = DEFAULTS["weight_decay"],
    seed: int = DEFAULTS["seed"],
    eval_every: int = 0,
    num_eval_problems: int = 200,
    log=print,
) -> Path:
    """Build the tokenizer and a tiny Qwen3, pretrain it, and `save_pretrained` both into `output_dir`.

    Also writes `pretrain_config.json` (the arguments, steps timing and the final held-out accuracies when measured).
    """
    import torch

    from .model import tiny_qwen3
    from .tokenizer import build_tokenizer

    config = dict(
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        warmup_steps=warmup_steps,
        weight_decay=weight_decay,
        seed=seed,
    )
    output_dir = Path(output_dir)
    tokenizer = build_tokenizer()
    model = tiny_qwen3(
        tokenizer,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        seed=seed,
    )
    eval_problems = generate_problems(num_eval_problems, seed=seed, split="heldout")
    records = pretrain(
        model,
        tokenizer,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        warmup_steps=warmup_steps,
        weight_decay=weight_decay,
        seed=seed,
        eval_every=eval_every,
        eval_problems=eval_problems,
        log=log,
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config.do_sample = True
    model.generation_config.temperature = 1.0
    model.generation_config.top_k = 0
    model.generation_config.top_p = 1.0
    model.generation_config.max_new_tokens = 32
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    info = {"pretrain": config, "torch": torch.__version__, "train_seconds": round(records[-1]["seconds"], 1)}
    info["final_loss"] = round(records[-1]["loss"], 4)
    (output_dir / "pretrain_config.json").write_text(json.dumps(info, indent=2) + "\n")
    return output_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True)
    for name, default in DEFAULTS.items():
        parser.add_argument(f"--{name}", type=type(default), default=default)
    parser.add_argument("--eval_every", type=int, default=0, help="measure held-out accuracy every N steps")
    parser.add_argument("--num_eval_problems", type=int, default=200)
    parser.add_argument("--evaluate", action="store_true", help="report final greedy and T=1.0 accuracy")
    args = vars(parser.parse_args(argv))
    run_eval = args.pop("evaluate")
    output_dir = build_toy_checkpoint(**args)
    if run_eval:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(output_dir)
        tokenizer = AutoTokenizer.from_pretrained(output_dir)
        problems = generate_problems(args["num_eval_problems"], seed=args["seed"] + 1, split="heldout")
        greedy = evaluate(model, tokenizer, problems)
        sampled = evaluate(model, tokenizer, problems, do_sample=True, num_samples=8)
        print(f"held-out ({len(problems)} problems): greedy={greedy:.3f} sampled(T=1.0, 8 each)={sampled:.3f}")
    print(f"saved to {output_dir}")


if __name__ == "__main__":
    main()
