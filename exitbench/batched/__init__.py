"""Batched decoding: B prompts of different lengths decoded together, each row exact to its batch-1 run.

:mod:`~exitbench.batched.forward` holds the batched forward (per-row positions over one KV cache),
:mod:`~exitbench.batched.methods` the batched greedy, early exit, self-speculation and CALM, registered
by name in :data:`BATCHED` so the `throughput` stage can run any of them at any batch size.
"""

from exitbench.batched.methods import BATCHED, BatchedMethod, BatchResult, batched_method

__all__ = ["BATCHED", "BatchResult", "BatchedMethod", "batched_method"]
