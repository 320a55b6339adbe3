"""Early-exit training: layer dropout, the early-exit loss, curricula, corpora and the training loop."""

from exitbench.training.trainer import TrainPaths, train

__all__ = ["TrainPaths", "train"]
