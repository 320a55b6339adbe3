"""Import every built-in task so it registers itself; use :func:`build_task` to get one by name."""

from exitbench.tasks import cnndm, humaneval, mbpp, topv2  # noqa: F401  (registration)
from exitbench.tasks.base import TASKS, Sample, Task, TaskSettings, build_task

__all__ = ["TASKS", "Sample", "Task", "TaskSettings", "build_task"]
