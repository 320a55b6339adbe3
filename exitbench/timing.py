"""Wall-clock timing of small loops, the helpers the bench and the kernel choice share."""

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


def interleaved_medians(fns: dict[str, Callable[[], Any]], iters: int, warmup: int = 2) -> dict[str, float]:
    """Median wall time of each ``fns`` entry over ``iters`` calls, the entries alternating call by call.

    Each runs ``warmup`` untimed calls first (a freshly loaded weight's pages are cold: whichever runs first
    would pay for them); then every round calls each entry once, in forward order on even rounds and reverse
    order on odd ones, so a drift of the machine's speed falls on all of them alike.
    """
    if iters < 1:
        raise ValueError(f"interleaved_medians needs iters >= 1, got {iters}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for index in range(iters):
        for name in names if index % 2 == 0 else reversed(names):
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}
