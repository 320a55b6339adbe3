"""The peer: transformers' own early-exit assisted generation (``generate(..., assistant_early_exit=E)``).

Hugging Face's ``EarlyExitCandidateGenerator`` (transformers >= 4.47, "self-speculative decoding" in the
LayerSkip model cards) drafts with the first E layers of the model itself plus its LM head, then verifies
the draft with the whole model. Unlike :mod:`exitbench.decoding.self_speculative` it shares neither the
KV cache nor the exit-layer hidden states between draft and verification: the assistant keeps its own
E-layer ``DynamicCache`` and the verifier re-runs all L layers over the d + 1 positions. Greedy
verification keeps the output identical to greedy decoding.

Facts about transformers 5.24 this wrapper relies on (read in ``transformers/generation/``):

- ``AssistedCandidateGenerator.__init__`` copies ``assistant_model.generation_config`` (here the model's
  own ``model.generation_config``) for ``num_assistant_tokens``, its schedule and
  ``assistant_confidence_threshold``; the same options given to ``generate()`` or in its
  ``generation_config=`` argument are ignored. So for the duration of the call the model's
  ``generation_config`` attribute is swapped for a patched copy (d drafts, a constant schedule, no
  confidence stop) and the original object is put back afterwards, untouched.
- ``assistant_early_exit`` must NOT be in that swapped config: the assistant's inner ``generate`` merges
  the model's config into its own, and would then run assisted generation recursively.
- ``generate`` fills ``None`` arguments from ``model.generation_config``, so passing ``eos_token_id=None``
  does not disable EOS; the swapped copy carries the EOS ids of our :class:`StopRule` instead.
- With a pad id that differs from every EOS id, the assistant's inner ``generate`` infers an attention
  mask from ``input_ids != pad_token_id`` over the whole sequence, generated tokens included
  (``_prepare_attention_mask_for_generation``), so a generated token equal to the pad id is masked out
  and later drafts go wrong (still exact output, but fewer accepted drafts). The swapped config
  therefore sets ``pad_token_id`` to the first EOS id (inference is skipped when pad == eos) or None.
- Acceptance statistics are not returned, but ``_assisted_decoding`` reports each round to
  ``candidate_generator.update_candidate_strategy(input_ids, scores, num_matches)``, with
  ``scores.shape[1] - 1`` drafted tokens. The generator is built by the model's
  ``_get_candidate_generator``; an instance-level wrapper (removed afterwards) records the rounds.

Our :class:`StopRule` (EOS ids and stop strings) also runs as a ``StoppingCriteria`` so generation stops
as early as the other methods, and :func:`steps.finish` applies it to the output, token for token.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from pydantic import Field
from transformers import StoppingCriteria, StoppingCriteriaList

from exitbench.decoding.base import DecodeResult, DecodingMethod, MethodOptions, StopRule, register
from exitbench.decoding.steps import as_ids, finish


class HFEarlyExitOptions(MethodOptions):
    exit_layer: int = Field(..., ge=1, description="E: layers the assistant drafts with")
    num_speculations: int = Field(..., ge=1, description="d: tokens drafted per round (constant schedule)")


class StopRuleCriteria(StoppingCriteria):
    """Our :class:`StopRule` as a transformers stopping criterion (batch size 1)."""

    def __init__(self, stop: StopRule, prompt_len: int) -> None:
        self.stop = stop
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        done = self.stop.cut(input_ids[0, self.prompt_len:].tolist()) is not None
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class RoundRecorder:
    """Wraps a candidate generator factory so each verification round is counted into a DecodeResult."""

    def __init__(self, result: DecodeResult, factory: Callable[..., Any]) -> None:
        self.result = result
        self.factory = factory

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        generator = self.factory(*args, **kwargs)
        update = generator.update_candidate_strategy
        result = self.result

        def recorded(input_ids: torch.Tensor, scores: torch.Tensor, num_matches: Any) -> Any:
            drafted, accepted = int(scores.shape[1]) - 1, int(num_matches)
            # Every round is one verification forward; one without candidates (no budget left, or no lookup
            # match) is a plain greedy step, counted as a round with 0 drafted, like exitbench's own methods.
            result.num_rounds += 1
            result.num_drafted += drafted
            result.num_accepted += accepted
            result.acceptance_histogram[min(accepted, len(result.acceptance_histogram) - 1)] += 1
            if drafted == 0:
                result.layer_calls["rounds_without_draft"] = result.layer_calls.get("rounds_without_draft", 0) + 1
            return update(input_ids, scores, num_matches)

        generator.update_candidate_strategy = recorded
        return generator


class HFAssisted(DecodingMethod):
    """transformers' assisted ``generate()`` of the model itself, greedy, with our stop rule and round counts.

    A subclass names the assistant (:meth:`_assistant_kwargs`, passed to ``generate``) and its draft length.
    """

    exact = True
    framework = "transformers"

    def _num_speculations(self) -> int:
        raise NotImplementedError

    def _assistant_kwargs(self) -> dict[str, Any]:
        raise NotImplementedError

    def _layer_calls(self, result: DecodeResult) -> dict[str, int]:
        return dict(result.layer_calls)

    def _assistant_config(self, stop: StopRule) -> Any:
        """A copy of the model's generation config with d constant drafts and our EOS ids."""
        config = copy.deepcopy(self.model.hf.generation_config)
        config.num_assistant_tokens = self._num_speculations()
        config.num_assistant_tokens_schedule = "constant"
        config.assistant_confidence_threshold = 0.0  # always draft d tokens
        config.do_sample = False
        eos = sorted(stop.eos_token_ids)
        config.eos_token_id = eos or None
        config.pad_token_id = eos[0] if eos else None  # see the module docstring: never a distinct pad id
        config.assistant_early_exit = None  # set per call only, or the assistant would recurse
        return config

    def _generate(self, prompt_ids: list[int], max_new_tokens: int, stop: StopRule) -> DecodeResult:
        result = DecodeResult(tokens=[], wall_time_s=0.0)
        result.acceptance_histogram = [0] * (self._num_speculations() + 1)
        if max_new_tokens < 1:
            return result
        hf = self.model.hf
        ids = as_ids(self.model, prompt_ids)
        original = hf.generation_config
        config = self._assistant_config(stop)
        hf.generation_config = config
        hf._get_candidate_generator = RoundRecorder(result, type(hf)._get_candidate_generator.__get__(hf))
        try:
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                stopping_criteria=StoppingCriteriaList([StopRuleCriteria(stop, len(prompt_ids))]),
                **self._assistant_kwargs(),
            )
        finally:
            hf.generation_config = original
            vars(hf).pop("_get_candidate_generator", None)
        result.tokens = finish(out[0, len(prompt_ids):].tolist(), max_new_tokens, stop)
        result.layer_calls = self._layer_calls(result)
        return result


@register
class HFEarlyExit(HFAssisted):
    name = "hf_early_exit"
    Options = HFEarlyExitOptions

    def _num_speculations(self) -> int:
        return self.options.num_speculations

    def _assistant_kwargs(self) -> dict[str, Any]:
        return {"assistant_early_exit": self.options.exit_layer}

    def _layer_calls(self, result: DecodeResult) -> dict[str, int]:
        # transformers' assistant runs one E-layer forward per drafted token; each round one L-layer verify.
        return {"draft_forwards": result.num_drafted, "verify_forwards": result.num_rounds}


@register
class HFGreedy(HFAssisted):
    """transformers' own greedy ``generate()`` of the same model: the baseline of its framework's peers.

    A peer's speed-up against it is the method's merit inside transformers; against exitbench's greedy it is
    what a user of the peer gets. Same generation config, stop rule and output handling as the peers.
    """

    name = "hf_greedy"

    def _num_speculations(self) -> int:
        return 0

    def _assistant_kwargs(self) -> dict[str, Any]:
        return {}

    def _layer_calls(self, result: DecodeResult) -> dict[str, int]:
        return {"full_forwards": len(result.tokens)}
