"""Benchmark tasks: prompt formats, targets and scoring; importing :mod:`exitbench.tasks.registry` registers them."""
