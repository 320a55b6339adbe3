"""Model loading/conversion and the early-exit view of a decoder."""

from exitbench.models.cache import KVCache
from exitbench.models.view import EarlyExitModel

__all__ = ["EarlyExitModel", "KVCache"]
