"""Self-speculation with an adaptive draft length: drafting stops once the draft head is unsure.

A LayerSkip round (:class:`~exitbench.decoding.self_speculative.SelfSpeculative`) drafts up to ``d`` tokens
through layers 0..E-1 and the shared head, but stops at the first draft whose probability under the draft
head is below ``min_confidence``, and drops it: a draft the early exit itself doubts is likely to be
rejected, and the forwards spent drafting past it are lost. The round length then follows the text: long
where the exit is sure (copied spans, closing brackets), short where it is not. The stopping rule is the
fixed-threshold form of Draft & Verify's adaptive draft-exiting (Zhang et al. 2023, arXiv:2309.08168: stop
drafting when the draft's top-1 probability falls below a threshold; there the threshold also adapts to the
measured acceptance). Verification is greedy, so the output is exactly greedy decoding's.
"""

from __future__ import annotations

from pydantic import Field

from exitbench.decoding.base import register
from exitbench.decoding.self_speculative import SelfSpeculative, SelfSpeculativeOptions


class AdaptiveSelfSpeculativeOptions(SelfSpeculativeOptions):
    num_speculations: int = Field(..., ge=1, description="d: the most tokens drafted per round")
    min_confidence: float = Field(
        ..., gt=0, lt=1, description="drafting stops at a draft whose draft-head probability is below this"
    )


@register
class AdaptiveSelfSpeculative(SelfSpeculative):
    name = "adaptive_self_speculative"
    Options = AdaptiveSelfSpeculativeOptions
    exact = True

    def min_confidence(self) -> float:
        return self.options.min_confidence
