import time

import pytest

from exitbench.timing import median_seconds


def test_warmup_calls_are_run_but_not_timed():
    durations = iter([0.05, 0.05, 0.0, 0.0, 0.02])  # two slow warm-up calls, then three timed ones
    calls = []

    def fn():
        calls.append(1)
        time.sleep(next(durations))

    # were the warm-up calls counted, the median of five would be >= 0.02 s
    assert median_seconds(fn, iters=3, warmup=2) < 0.01
    assert len(calls) == 5


def test_at_least_one_timed_call():
    with pytest.raises(ValueError, match="iters >= 1"):
        median_seconds(lambda: None, iters=0)
