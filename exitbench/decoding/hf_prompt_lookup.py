"""The peer of ``prompt_lookup``: transformers' own prompt-lookup generation (``generate(prompt_lookup_num_tokens=d)``).

transformers' ``PromptLookupCandidateGenerator`` drafts by the same rule as
:func:`exitbench.decoding.prompt_lookup.lookup_draft` (longest n-gram first, leftmost match, cut before an
EOS), so the two draft the same tokens and differ only in the engine: transformers' forward, cache and
generation loop against exitbench's. Verification is greedy, so the output equals greedy decoding. The
generation-config handling, stop rule and round counting are those of
:class:`~exitbench.decoding.hf_early_exit.HFAssisted`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from exitbench.decoding.base import DecodeResult, MethodOptions, register
from exitbench.decoding.hf_early_exit import HFAssisted


class HFPromptLookupOptions(MethodOptions):
    ngram_size: int = Field(3, ge=1, description="n: max_matching_ngram_size")
    num_speculations: int = Field(10, ge=1, description="d: prompt_lookup_num_tokens")


@register
class HFPromptLookup(HFAssisted):
    name = "hf_prompt_lookup"
    Options = HFPromptLookupOptions

    def _num_speculations(self) -> int:
        return self.options.num_speculations

    def _assistant_kwargs(self) -> dict[str, Any]:
        return {"prompt_lookup_num_tokens": self.options.num_speculations,
                "max_matching_ngram_size": self.options.ngram_size}

    def _layer_calls(self, result: DecodeResult) -> dict[str, int]:
        misses = result.layer_calls.get("rounds_without_draft", 0)
        return {"verify_forwards": result.num_rounds, "lookup_misses": misses}
