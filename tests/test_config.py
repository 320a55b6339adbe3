"""params.yaml -> typed config: accepted profiles, rejected keys and types, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exitbench import config
from exitbench.errors import ExitbenchError

REPO = Path(__file__).resolve().parents[1]


def test_repository_params_resolve_for_every_profile():
    for profile in config.PROFILES:
        cfg = config.load(REPO / "params.yaml", profile=profile)
        assert cfg.profile == profile
        assert set(cfg.train.variants) == {"layerskip", "calm"}


def test_profile_overrides_merge_into_defaults():
    raw = {
        "train": {"variants": {"layerskip": {"steps": 10, "lr": 0.5}}},
        "profiles": {"smoke": {"train": {"variants": {"layerskip": {"steps": 2}}}}},
    }
    cpu = config.resolve(raw, profile="cpu")
    smoke = config.resolve(raw, profile="smoke")
    assert cpu.train.variants["layerskip"].steps == 10
    assert smoke.train.variants["layerskip"].steps == 2
    assert smoke.train.variants["layerskip"].lr == 0.5  # untouched keys keep the default section's value


def test_config_is_frozen():
    cfg = config.resolve({})
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises its own ValidationError on frozen models
        cfg.base.seed = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"train": {"variants": {"layerskip": {"stepz": 3}}}}, "unknown key 'train.variants.layerskip.stepz'"),
        ({"bench": {"num_prompts": "many"}}, "'bench.num_prompts': Input should be a valid integer"),
        ({"base": {"dtype": "float8"}}, "'base.dtype': Input should be 'float32', 'bfloat16' or 'float16'"),
        ({"evaluat": {}}, "unknown key 'evaluat'; allowed keys here: base, bench"),
        ({"profile": "gpu"}, "profile 'gpu' is not known"),
        ({"profiles": {"fast": {}}}, "unknown profile(s) ['fast']"),
        ({"calibrate": {"epsilon": 2.0}}, "'calibrate.epsilon': Input should be less than 1"),
    ],
)
def test_bad_values_give_one_clear_line(raw, expected):
    with pytest.raises(ExitbenchError) as info:
        config.resolve(raw)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_unknown_key_lists_allowed_keys():
    with pytest.raises(ExitbenchError, match=r"allowed keys here: .*num_speculations"):
        config.resolve({"bench": {"exit_layer": [1]}})


def test_stage_view_holds_only_the_sections_a_stage_reads():
    cfg = config.resolve({})
    view = config.stage_view(cfg, "train")
    assert set(view) == {"profile", "base", "model", "train"}
    narrowed = config.train_variant_view(cfg, "layerskip") if "layerskip" in cfg.train.variants else None
    assert narrowed is not None and list(narrowed["train"]["variants"]) == ["layerskip"]
    with pytest.raises(ExitbenchError, match="unknown training variant"):
        config.train_variant_view(cfg, "nope")


def test_load_stage_roundtrip(tmp_path):
    cfg = config.load(REPO / "params.yaml", profile="smoke")
    path = tmp_path / "evaluate.json"
    path.write_text(json.dumps(config.stage_view(cfg, "evaluate")))
    loaded = config.load_stage(path)
    assert loaded.evaluate == cfg.evaluate
    assert loaded.profile == "smoke"


def test_wrong_key_in_params_file_is_one_line_without_traceback(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text().replace("  seed: 1234", "  sed: 1234"))
    out = tmp_path / "config"
    proc = subprocess.run(
        [sys.executable, str(REPO / "pipelines" / "configure.py"), "--params", str(params), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert "unknown key 'base.sed'" in proc.stderr


def test_configure_writes_one_file_per_stage(tmp_path):
    out = tmp_path / "config"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "pipelines" / "configure.py"),
            "--params",
            str(REPO / "params.yaml"),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    names = {p.name for p in out.iterdir()}
    assert {f"{stage}.json" for stage in config.STAGE_SECTIONS} <= names
    assert {"train-layerskip.json", "train-calm.json"} <= names


def test_paper_profile_trains_with_the_papers_topv2_settings():
    """The paper profile's LayerSkip variant = replications/layerskip.yaml's TOPv2 finetune (Table 8/9)."""
    runs = yaml.safe_load((REPO / "replications" / "layerskip.yaml").read_text())["training"]
    paper = next(run for run in runs if run["id"] == "topv2-llama-1.5b")
    variant = config.load(REPO / "params.yaml", profile="paper").train.variants["layerskip"]
    assert variant.batch_size * variant.grad_accum == paper["batch_size"]
    assert (variant.steps, variant.lr, variant.p_max, variant.e_scale) == (
        paper["steps"], paper["lr"], paper["p_max"], paper["e_scale"]
    )
    assert variant.curriculum == paper["early_exit_curriculum"] and variant.dropout_schedule == "continual"
    assert not variant.freeze_embeddings  # the paper trains every weight
