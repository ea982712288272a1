"""The evaluation tasks by name: ``"math"`` (Table 2) and ``"code"`` (Table 3)."""

from __future__ import annotations

from .code_task import CODE
from .math_task import MATH
from .task import Task


TASKS: dict[str, Task] = {MATH.name: MATH, CODE.name: CODE}


def get_task(task: str | Task) -> Task:
    if isinstance(task, Task):
        return task
    if task not in TASKS:
        raise ValueError(f"task: unknown {task!r}; use one of {', '.join(TASKS)}")
    return TASKS[task]
