"""Grading: the task's rules, then, for math and only when asked, a model verifier (paper §5.1).

The rules are the training reward (`math_reward`; the code sandbox's tests): precise, with a low recall on
free-form answers. The paper corrected their errors with CompassVerifier-3B. Here the verifier is an evaluation-only
second stage, off by default and never part of a training reward (a model verifier can be gamed by a policy
trained against it): only the completions the rules judged wrong are sent to it, greedy and with a bounded length,
and a sample counts as correct only on its "A" verdict ("B" incorrect, "C" invalid, anything else unparseable:
all incorrect). The records keep the rule verdict (``correct``) and the model's (``verifier_verdict``) apart, so
`regrade` can add or drop the verifier without generating, and the tables show both numbers.

The prompt: CompassVerifier's own prompt is not distributed with this package (its repository carries no
license), so the user passes it as a text file with the placeholders ``{question}``, ``{gold_answer}`` and
``{llm_response}`` (e.g. ``CV_PROMPT`` of the CompassVerifier repository's ``src/prompts.py``). Any causal LM that
answers A / B / C to such a prompt can stand in for CompassVerifier.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .generation import make_backend
from .store import SAMPLES_FILE, append_records, latest, read_samples
from .task import Task


logger = logging.getLogger(__name__)

#: `regrade`'s default: keep the run's verifier and its verdicts.
KEEP = "keep"

DEFAULT_VERIFIER = "opencompass/CompassVerifier-3B"
PLACEHOLDERS = ("{question}", "{gold_answer}", "{llm_response}")
VERDICTS = ("A", "B", "C")
#: The verdict stored for an output that is none of A / B / C; counted as incorrect.
UNPARSEABLE = "unparseable"
_KEPT_OUTPUT_CHARS = 200


def grade_rules(
    task: Task,
    completions: Sequence[str],
    golds: Sequence[str],
    options: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """The rule verdicts of the task: ``[{"extracted_answer", "correct", "grading"}, ...]``."""
    if not completions:
        return []
    return task.grade(completions, golds, options)


@dataclass(frozen=True)
class VerifierConfig:
    """The model verifier: which model, with which prompt, how it generates.

    Attributes:
        prompt_file: a text file holding the prompt, with ``{question}``, ``{gold_answer}`` and ``{llm_response}``
            where the question, the gold answer and the completion go (one user turn, rendered by the verifier's
            chat template). Required: CompassVerifier's prompt is not shipped (see the module's docstring).
        model: a Hub id or local checkpoint of a causal LM (default: CompassVerifier-3B).
        backend: ``"auto"``, ``"vllm"`` or ``"transformers"``, as for generation.
        max_new_tokens: the verdict's length bound (greedy decoding); CompassVerifier answers one letter.
        batch_size: requests per call (default: the backend's).
        dtype: the verifier's dtype.
        vllm_kwargs: extra ``vllm.LLM`` arguments (``max_model_len``, ``gpu_memory_utilization``...).
    """

    prompt_file: str | None = None
    model: str = DEFAULT_VERIFIER
    backend: str = "auto"
    max_new_tokens: int = 32
    batch_size: int | None = None
    dtype: str = "auto"
    vllm_kwargs: tuple[tuple[str, Any], ...] = ()

    def check(self) -> str:
        """The prompt template, after checking it (an error naming the field and the fix when it is unusable)."""
        if self.prompt_file is None:
            raise ValueError(
                "verifier prompt_file (--verifier_prompt): required. CompassVerifier's prompt is not distributed "
                "with this package; save it (CV_PROMPT in src/prompts.py of the CompassVerifier repository) to a "
                f"text file with the placeholders {', '.join(PLACEHOLDERS)} and pass its path"
            )
        path = Path(self.prompt_file).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"verifier prompt_file (--verifier_prompt): no file {path}")
        template = path.read_text(encoding="utf-8")
        missing = [placeholder for placeholder in PLACEHOLDERS if placeholder not in template]
        if missing:
            raise ValueError(
                f"verifier prompt_file (--verifier_prompt): {path} lacks {', '.join(missing)}; the prompt must say "
                f"where the question, the gold answer and the response go ({', '.join(PLACEHOLDERS)})"
            )
        if self.max_new_tokens < 1:
            raise ValueError(f"verifier max_new_tokens: must be >= 1, got {self.max_new_tokens}")
        return template

    def describe(self) -> dict[str, Any]:
        """What ``run.json`` records (enough to use the same verifier again on `regrade`)."""
        template = self.check()
        return {
            "model": self.model,
            "prompt_file": str(Path(self.prompt_file).expanduser().resolve()),
            "prompt_sha256": hashlib.sha256(template.encode()).hexdigest(),
            "backend": self.backend,
            "max_new_tokens": self.max_new_tokens,
            "dtype": self.dtype,
        }

    @classmethod
    def from_description(cls, description: Mapping[str, Any]) -> VerifierConfig:
        keys = ("prompt_file", "model", "backend", "max_new_tokens", "dtype")
        return cls(**{key: description[key] for key in keys if key in description})


def verifier_prompt(template: str, question: str, gold: str, completion: str) -> list[dict[str, str]]:
    """The verifier's conversation: the template with the three fields filled in, as one user turn.

    The fields are substituted literally (no ``str.format``), so braces elsewhere in the template or in the
    texts (LaTeX) stay as they are.
    """
    text = template
    for placeholder, value in zip(PLACEHOLDERS, (question, gold, completion)):
        text = text.replace(placeholder, value)
    return [{"role": "user", "content": text}]


_BOXED_VERDICT = re.compile(r"\\boxed\{\s*([ABC])\s*\}")
_LONE_VERDICT = re.compile(r"^\W*([ABC])\W*$")


def parse_verdict(output: str) -> str:
    """``"A"``, ``"B"`` or ``"C"`` from the verifier's output: its last ``\\boxed{X}``, else the output when it is
    that one letter alone (``"A"``, ``"(B)"``); `UNPARSEABLE` for anything else ("A lot of..." included)."""
    boxed = _BOXED_VERDICT.findall(output)
    if boxed:
        return boxed[-1]
    match = _LONE_VERDICT.match(output.strip())
    return match[1] if match else UNPARSEABLE


def apply_verifier(
    output_dir: str | os.PathLike,
    verifier: VerifierConfig,
    questions: Mapping[tuple[str, str], str],
) -> int:
    """Ask the verifier about every rule negative of the run's plan (`questions`: its problems' texts) that has no
    verdict from it yet; returns how many.

    Each judged record is appended again with ``verifier``, ``verifier_verdict`` and ``verifier_output`` (the
    last record of a sample wins), batch by batch, so an interrupted pass resumes. Only records whose completion
    exists and whose rule verdict is ``False`` are sent; the rule verdict itself is never changed.
    """
    template = verifier.check()
    samples_path = Path(output_dir) / SAMPLES_FILE
    pending = [
        record
        for record in latest(read_samples(samples_path, repair=True)).values()
        if record.get("correct") is False
        and record.get("completion") is not None
        and not (record.get("verifier") == verifier.model and record.get("verifier_verdict") is not None)
        and (record["benchmark"], str(record["problem_id"])) in questions  # the problems of the current plan
    ]
    if not pending:
        return 0
    logger.info("verifier %s: %d rule negatives to judge", verifier.model, len(pending))
    backend = make_backend(
        verifier.model,
        verifier.backend,
        dtype=verifier.dtype,
        **dict(verifier.vllm_kwargs),
    )
    batch_size = verifier.batch_size or backend.default_batch_size
    try:
        with open(samples_path, "a", encoding="utf-8") as file:
            for start in range(0, len(pending), batch_size):
                batch = pending[start : start + batch_size]
                prompts = [
                    verifier_prompt(
                        template,
                        questions[(r["benchmark"], str(r["problem_id"]))],
                        str(r["gold"]),
                        r["completion"],
                    )
                    for r in batch
                ]
                outputs = backend.generate(
                    prompts,
                    [0] * len(batch),
                    temperature=0.0,
                    top_p=1.0,
                    max_new_tokens=verifier.max_new_tokens,
                )
                judged = [
                    {
                        **record,
                        "verifier": verifier.model,
                        "verifier_verdict": parse_verdict(output.text),
                        "verifier_output": output.text[:_KEPT_OUTPUT_CHARS],
                    }
                    for record, output in zip(batch, outputs, strict=True)
                ]
                append_records(file, judged)
    finally:
        del backend
    return len(pending)
