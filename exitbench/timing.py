"""Wall-clock timing of small loops: the one helper the bench and the kernel choice share."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def median_seconds(fn: Callable[[], Any], iters: int, warmup: int = 2, device: torch.device | None = None) -> float:
    """Median wall time of ``fn()`` over ``iters`` calls after ``warmup`` untimed ones.

    On a CUDA ``device`` the queue is drained before and after each call, so the time is the kernel's,
    not the launch's.
    """
    if iters < 1:
        raise ValueError(f"median_seconds needs iters >= 1, got {iters}")
    sync = torch.cuda.synchronize if device is not None and device.type == "cuda" else (lambda: None)
    times = []
    for index in range(warmup + iters):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)
