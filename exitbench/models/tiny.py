"""Seeded random-weight Llama models: the tiny test fixture, and real shapes for timing."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def random_llama(
    num_layers: int = 4,
    hidden_size: int = 64,
    vocab_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    tie_word_embeddings: bool = True,
    init_std: float = 0.2,
) -> LlamaForCausalLM:
    """A Llama with seeded random weights (default: the tiny 4-layer test model), in eval mode."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
        # A larger-than-default init: a random model then writes varied tokens instead of repeating one,
        # so equality tests exercise both accepted and rejected drafts.
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() >= 2:
                    param.normal_(0.0, init_std)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.to(dtype).eval()
