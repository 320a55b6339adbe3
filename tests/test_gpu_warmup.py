"""On a GPU each sample's prompt is prefilled once, untimed, before its timed round (evaluation.run_methods):
the first call of a new matrix shape is slow there and would otherwise fall on greedy, the first method."""

from __future__ import annotations

from exitbench.decoding.base import DecodeResult, StopRule
from exitbench.evaluation import TIMING_PROTOCOL, run_methods, timing_protocol
from exitbench.prompts import TaskBatch
from exitbench.records import RecordFile
from exitbench.tasks.registry import build_task


class Spy:
    """A decoding method that records each call's prompt and token budget."""

    def __init__(self, calls: list, name: str) -> None:
        self.calls, self.name = calls, name

    def generate(self, prompt, max_new_tokens, stop=None):
        self.calls.append((self.name, tuple(prompt), max_new_tokens))
        return DecodeResult(tokens=[5] * max_new_tokens, wall_time_s=0.001)


class Tok:
    def decode(self, ids, skip_special_tokens=True):
        return "x" * len(ids)


def batch(prompts) -> TaskBatch:
    task = build_task("topv2")
    samples = [task.samples([{"domain": "alarm", "utterance": f"u{i}", "semantic_parse": "[IN:A ]"}], 1)[0]
               for i in range(len(prompts))]
    return TaskBatch(task, samples, prompts, StopRule(), 3, Tok())


def test_each_samples_round_starts_with_an_untimed_prefill_only_when_asked(tmp_path):
    prompts = [[1, 2], [1, 2, 3]]
    for warm in (False, True):
        calls: list = []
        runs = {name: (Spy(calls, name), RecordFile(tmp_path / f"{warm}-{name}.jsonl", "k"))
                for name in ("greedy", "other")}
        run_methods(runs, batch(prompts), "t", warm_each_sample=warm)
        first, second = (1, 2), (1, 2, 3)
        warmups = [("greedy", first, 3), ("other", first, 3)]  # each method's one warm-up generation
        rounds = [("greedy", first, 3), ("other", first, 3), ("greedy", second, 3), ("other", second, 3)]
        if warm:  # each prompt's untimed prefill by the first method, right before its round
            rounds = [("greedy", first, 1), *rounds[:2], ("greedy", second, 1), *rounds[2:]]
        assert calls == warmups + rounds


def test_the_protocol_says_so_on_cuda_and_is_unchanged_on_the_cpu():
    assert timing_protocol("cpu") == TIMING_PROTOCOL  # stored CPU records stay valid
    assert timing_protocol("cuda").startswith(TIMING_PROTOCOL) and "untimed" in timing_protocol("cuda")
