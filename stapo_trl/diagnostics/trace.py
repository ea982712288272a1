"""Token traces: which tokens S2T silenced (and a sample of the candidates it kept), with their context.

Opt in with `STAPOConfig(spurious_trace=True)`. Every process appends to its own file,
`<output_dir>/spurious_trace/rank-<process index>.jsonl`, one JSON object per traced token:

    step (the optimizer step, numbered as in the logs), micro_batch (micro-batches seen by this process, counting
    from 0: several share a step under gradient accumulation), rank, status ("silenced" | "kept"), sample (row of the
    micro-batch), position (index in the completion),
    token_id, token, probability, entropy, advantage, entropy_threshold, context_before, context_after,
    top_alternatives ([{"token", "token_id", "probability"}, ...], the policy's top-k at that position),
    gradient_norm (|Â| ‖∇_a log π(y)‖, the norm of the token's gradient with respect to its logits at importance
    weight 1), entropy_change (the first-order entropy change at its position per unit step of that gradient;
    `stapo_trl.mechanism`)

Per micro-batch at most `spurious_trace_max_silenced` silenced tokens and `spurious_trace_max_kept` kept candidates
are written (a random sample when there are more), so a trace grows by a bounded amount per step. The top-k
alternatives need the full next-token distribution at the traced positions, which the loss does not keep: the
tracer recomputes the logits of the traced rows in one extra no-grad forward pass, on every process even when it
has nothing to trace (under FSDP a forward is a collective). With tracing off, nothing here runs.
torch is imported inside the writer's methods, so that reading a trace (the report command) does not load it.

The reader (`trace_files`, `iter_trace`, `load_trace`) is the other half: a trace is plain JSON lines, so
`pandas.read_json(path, lines=True)` reads one file too.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path


logger = logging.getLogger(__name__)

TRACE_DIRNAME = "spurious_trace"
STATUSES = ("silenced", "kept")

# How whitespace looks in token labels (the paper's notation: ␣ for a space, \n for a newline).
_VISIBLE = {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


class SpuriousTokenTracer:
    def __init__(
        self, output_dir, process_index, tokenizer, temperature=1.0, max_silenced=64, max_kept=16, context_tokens=32,
        top_k=5,
    ):  # fmt: skip
        import torch

        self.directory = os.path.join(output_dir, TRACE_DIRNAME)
        os.makedirs(self.directory, exist_ok=True)
        self.path = os.path.join(self.directory, f"rank-{process_index}.jsonl")
        open(self.path, "a").close()  # from the start: a run that traced nothing has an empty trace, not none
        self.rank = process_index
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.max_silenced, self.max_kept = max_silenced, max_kept
        self.context_tokens, self.top_k = context_tokens, top_k
        self.generator = torch.Generator().manual_seed(process_index)

    def _sample(self, mask, limit: int):
        import torch

        positions = mask.nonzero().cpu()
        if len(positions) > limit:
            positions = positions[torch.randperm(len(positions), generator=self.generator)[:limit]]
        return positions

    def record(
        self, step, micro_batch, model, inputs, per_token_logps, entropies, advantages, silenced, candidates, threshold
    ):
        """Append the traced tokens of one micro-batch to this process's file."""
        traced = [("silenced", p) for p in self._sample(silenced, self.max_silenced)]
        traced += [("kept", p) for p in self._sample(candidates & ~silenced, self.max_kept)]
        rows = sorted({int(position[0]) for _, position in traced}) or [0]
        top_probabilities, top_ids, collision, collision_log = self._top_alternatives(model, inputs, rows)
        if not traced:
            return
        from ..mechanism import first_order_entropy_change, logit_gradient_norm

        completion_ids = inputs["completion_ids"]
        advantages = advantages.expand_as(per_token_logps)
        logps, row_advantages = per_token_logps[rows].float().cpu(), advantages[rows].float().cpu()
        gradient_norms = row_advantages.abs() * logit_gradient_norm(logps, collision)
        entropy_changes = first_order_entropy_change(
            logps, entropies[rows].float().cpu(), collision, collision_log, row_advantages
        )
        threshold = float(threshold)
        with open(self.path, "a") as trace_file:
            for status, (row, column) in traced:
                row, column = int(row), int(column)
                ids = completion_ids[row].tolist()
                start, end = max(0, column - self.context_tokens), column + 1 + self.context_tokens
                record = {
                    "step": step,
                    "micro_batch": micro_batch,
                    "rank": self.rank,
                    "status": status,
                    "sample": row,
                    "position": column,
                    "token_id": ids[column],
                    "token": self.tokenizer.decode([ids[column]]),
                    "probability": float(per_token_logps[row, column].exp()),
                    "entropy": float(entropies[row, column]),
                    "advantage": float(advantages[row, column]),
                    "entropy_threshold": threshold if threshold == threshold else None,  # NaN is not JSON
                    "context_before": self.tokenizer.decode(ids[start:column], skip_special_tokens=True),
                    "context_after": self.tokenizer.decode(ids[column + 1 : end], skip_special_tokens=True),
                    "top_alternatives": [
                        {"token": self.tokenizer.decode([token_id]), "token_id": token_id, "probability": probability}
                        for token_id, probability in zip(
                            top_ids[rows.index(row), column].tolist(),
                            top_probabilities[rows.index(row), column].tolist(),
                            strict=True,
                        )
                    ],
                    "gradient_norm": float(gradient_norms[rows.index(row), column]),
                    "entropy_change": float(entropy_changes[rows.index(row), column]),
                }
                trace_file.write(json.dumps(record, ensure_ascii=False) + "\n")

    def _top_alternatives(self, model, inputs, rows):
        """Top-k probabilities and token ids, Σ π² and Σ π² ln π at every completion position of the given rows."""
        import torch

        prompt_ids, completion_ids = inputs["prompt_ids"][rows], inputs["completion_ids"][rows]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"][rows], inputs["completion_mask"][rows]], dim=1)
        with torch.no_grad():
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        # Position t - 1 predicts completion token t; the policy samples (and the loss scores) at the temperature.
        log_probs = (logits[:, prompt_ids.size(1) - 1 : -1].float() / self.temperature).log_softmax(-1)
        probabilities, token_ids = log_probs.exp().topk(self.top_k, dim=-1)
        squared = (2 * log_probs).exp()
        collision, collision_log = squared.sum(-1), (squared * log_probs).sum(-1)
        return probabilities.cpu(), token_ids.cpu(), collision.cpu(), collision_log.cpu()


# ------------------------------------------------------------------------------------------------------- reading


def trace_files(path: str | os.PathLike) -> list[Path]:
    """The trace files of a run: `path` is a run directory, its `spurious_trace/` folder, or one `.jsonl` file."""
    path = Path(path)
    if path.is_file():
        return [path]
    directory = path / TRACE_DIRNAME if (path / TRACE_DIRNAME).is_dir() else path
    files = sorted(directory.glob("rank-*.jsonl"), key=lambda f: (len(f.name), f.name))  # rank-2 before rank-10
    if not files:
        raise FileNotFoundError(
            f"No trace in {path}: expected {path / TRACE_DIRNAME}/rank-<i>.jsonl, written when the run had "
            "STAPOConfig(spurious_trace=True)."
        )
    return files


def run_root(path: str | os.PathLike) -> Path:
    """The run directory of a trace path: a run directory, its trace folder or a trace file."""
    path = Path(path)
    if path.is_file():
        path = path.parent
    return path.parent if path.name == TRACE_DIRNAME else path


def iter_trace(path: str | os.PathLike) -> Iterator[dict]:
    """Stream the rows of every rank file of a trace (file order, not sorted). Unreadable lines are skipped with a
    warning (the last line of a file is cut short when a run is killed while writing it)."""
    for trace_file in trace_files(path):
        bad = 0
        with open(trace_file, encoding="utf-8") as lines:
            for line in lines:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    row = None
                if isinstance(row, dict):
                    yield row
                else:
                    bad += 1
        if bad:
            logger.warning("Skipped %d unreadable line(s) of %s.", bad, trace_file)


def row_order(row: Mapping) -> tuple:
    """Training order of trace rows: step, then rank, sample and position."""
    return (row.get("step", 0), row.get("rank", 0), row.get("sample", 0), row.get("position", 0))


def load_trace(run_dir: str | os.PathLike) -> list[dict]:
    """All rows of a run's trace, every rank file, sorted by step (then rank, sample, position)."""
    return sorted(iter_trace(run_dir), key=row_order)


def visible_token(token: str) -> str:
    """The token with its whitespace made visible: " the" -> "␣the", "\\n\\n" -> "\\\\n\\\\n", "" -> "∅"."""
    if token == "":
        return "∅"
    return "".join(
        _VISIBLE.get(char, f"\\u{ord(char):04x}" if char.isspace() or not char.isprintable() else char)
        for char in token
    )
