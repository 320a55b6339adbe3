"""Tiny random-weight stand-ins for hub checkpoints: the paper profile's dry run, offline and on a CPU.

With ``EXITBENCH_HUB_STANDINS=<dir>`` set, every hub id a stage loads comes from ``<dir>/<hub id>``
instead of the hub (:func:`exitbench.models.sources.load_hub`), recorded as ``kind: standin``. A stand-in
keeps what the graph depends on, the real layer count (so the experiments' exit layers are valid), and
shrinks the rest: width 32, a 2,048-token byte-level BPE tokenizer, weights seeded from the hub id. Its outputs
mean nothing; the dry run checks that every stage, result file and check row appears.

    python -m exitbench.models.standins --params params.yaml --out build/standins
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from exitbench.errors import ExitbenchError

STANDINS_ENV = "EXITBENCH_HUB_STANDINS"

#: num_hidden_layers of the checkpoints the experiments name (each model's config.json on the hub)
HUB_LAYERS = {
    "meta-llama/Llama-2-7b-hf": 32,
    "facebook/layerskip-llama2-7B": 32,
    "codellama/CodeLlama-7b-hf": 32,
    "facebook/layerskip-codellama-7B": 32,
    "meta-llama/Llama-3.2-1B": 16,
    "facebook/layerskip-llama3.2-1B": 16,
}
SPECIALS = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2: pad, bos, eos as in exitbench.models.tiny.random_llama


#: standard-library modules whose source (code and English docstrings) trains the stand-ins' tokenizer
CORPUS_MODULES = ("argparse", "collections", "dataclasses", "email.message", "json.decoder", "logging",
                  "pathlib", "string", "textwrap", "typing")
VOCAB_SIZE = 2048


def standin_tokenizer():
    """A byte-level BPE tokenizer (2,048 tokens, merges learned from standard-library source, so prompts are a
    few times shorter than bytes) that prepends ``<s>``; deterministic for a given Python version."""
    import importlib
    import inspect

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [inspect.getsource(importlib.import_module(name)) for name in CORPUS_MODULES]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(texts, trainer=trainer)
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def make_standin(hub_id: str, out_dir: Path) -> Path:
    """Write the stand-in of ``hub_id`` under ``out_dir/<hub id>`` (a Hugging Face checkpoint directory)."""
    from exitbench.models.tiny import random_llama

    if hub_id not in HUB_LAYERS:
        raise ExitbenchError(
            f"no stand-in shape for '{hub_id}'; add its num_hidden_layers to HUB_LAYERS in exitbench/models/standins.py"
        )
    tokenizer = standin_tokenizer()
    seed = int(hashlib.sha256(hub_id.encode()).hexdigest()[:8], 16)
    model = random_llama(num_layers=HUB_LAYERS[hub_id], hidden_size=32, vocab_size=len(tokenizer), num_heads=4,
                         num_kv_heads=2, seed=seed, init_std=0.1)
    target = out_dir / hub_id
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    (target / "standin.json").write_text(json.dumps({"stands_in_for": hub_id, "seed": seed}) + "\n")
    return target


def standin_dir(hub_id: str, root: str | Path) -> Path:
    """The stand-in directory of ``hub_id``; one clear error when it was not made."""
    target = Path(root) / hub_id
    if not (target / "config.json").is_file():
        raise ExitbenchError(
            f"{STANDINS_ENV}={root} has no stand-in for '{hub_id}'; make them with "
            f"`python -m exitbench.models.standins --out {root}`, or unset {STANDINS_ENV} to load from the hub"
        )
    return target


def experiment_hub_ids(params: str | Path) -> list[str]:
    """Every hub id an experiment in ``params`` names, in order of appearance."""
    from exitbench.config import experiments_of

    ids: list[str] = []
    for experiment in experiments_of(params).values():
        ids += [spec.hub_id for spec in experiment.models.values() if spec.hub_id and spec.hub_id not in ids]
    return ids


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="the experiments whose hub ids get stand-ins")
    parser.add_argument("--out", default="build/standins")
    args = parser.parse_args(argv)
    for hub_id in experiment_hub_ids(args.params):
        print(f"standin: {hub_id} ({HUB_LAYERS.get(hub_id, '?')} layers) -> {make_standin(hub_id, Path(args.out))}")


if __name__ == "__main__":
    from exitbench.cli import run_stage

    run_stage(main)
