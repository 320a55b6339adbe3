"""params.yaml -> typed config: accepted profiles, rejected keys and types, one-line errors."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exitbench import config
from exitbench.errors import ExitbenchError

REPO = Path(__file__).resolve().parents[1]


def every_run() -> list[tuple[str, str]]:
    """(profile, experiment) for every profile: each paper experiment under paper and paper_dry, each twin under
    twin."""
    experiments = config.experiments_of(REPO / "params.yaml")
    def names(profile: str) -> list[str]:
        if profile == "twin":
            return [n for n, e in experiments.items() if e.profile == "twin"]
        return [n for n, e in experiments.items() if e.profile == "paper"] if "paper" in profile else [""]

    return [(profile, name) for profile in config.PROFILES for name in names(profile)]


def test_repository_params_resolve_for_every_profile():
    for profile, experiment in every_run():
        cfg = config.load(REPO / "params.yaml", profile=profile, experiment=experiment)
        assert (cfg.profile, cfg.experiment) == (profile, experiment)
        assert set(cfg.train.variants) == {"plain", "layerskip", "calm"}


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
        ({"bench": {"num_prompts": "many"}}, 'bench.num_prompts: expected an integer, got "many"'),
        ({"base": {"dtype": "float8"}}, "base.dtype: Input should be 'float32', 'bfloat16' or 'float16'"),
        ({"evaluat": {}}, "unknown key 'evaluat'; allowed keys here: adapters, base, bench"),
        ({"profile": "gpu"}, "profile 'gpu' is not known"),
        ({"profiles": {"fast": {}}}, "unknown profile(s) ['fast']"),
        ({"calibrate": {"epsilon": 2.0}}, "calibrate.epsilon: Input should be less than 1"),
        ({"evaluate": {"tasks": {"topv2": {"num_samples": True}}}},
         "evaluate.tasks.topv2.num_samples: expected an integer, got true"),
        ({"bench": {"num_prompts": "2"}}, 'bench.num_prompts: expected an integer, got "2" (text, not a number'),
        ({"train": {"variants": {"calm": {"lr": "1e-4"}}}}, 'lr: expected a number, got "1e-4" (YAML reads 1e-4 as'),
        ({"train": {"variants": {"calm": {"autocast_bf16": 1}}}}, "autocast_bf16: expected true or false, got 1"),
        ({"base": {"seed": 1.5}}, "base.seed: expected an integer, got 1.5"),
        ({"bench": {"exit_layers": [8, 0]}}, "bench.exit_layers.1: Input should be greater than or equal to 1"),
    ],
)
def test_bad_values_give_one_clear_line(raw, expected):
    with pytest.raises(ExitbenchError) as info:
        config.resolve(raw)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_strict_types_take_yaml_floats_ints_as_floats_and_configure_json():
    raw = yaml.safe_load("train: {variants: {layerskip: {lr: 1.0e-4, e_scale: 1, grad_clip: 2}}}")
    variant = config.resolve(raw).train.variants["layerskip"]
    assert (variant.lr, variant.e_scale, variant.grad_clip) == (1.0e-4, 1.0, 2.0)
    for profile, experiment in every_run():  # every stage's build/config JSON (lists, mappings) validates back
        cfg = config.load(REPO / "params.yaml", profile=profile, experiment=experiment)
        for stage, sections in config.STAGE_SECTIONS.items():
            loaded = config.Config.model_validate(json.loads(json.dumps(config.stage_view(cfg, stage))))
            assert all(getattr(loaded, name) == getattr(cfg, name) for name in sections)


def test_unknown_key_lists_allowed_keys():
    with pytest.raises(ExitbenchError, match=r"allowed keys here: .*num_speculations"):
        config.resolve({"bench": {"exit_layer": [1]}})


def configure_stage():
    """pipelines/configure.py as a module (its strict method-option check is what `configure` runs)."""
    spec = importlib.util.spec_from_file_location("configure_stage", REPO / "pipelines" / "configure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_references(raw: dict) -> None:
    from exitbench.decoding import REGISTRY
    from exitbench.tasks.registry import TASKS

    variants = {"train": {"variants": {"layerskip": {}, "calm": {"recipe": "calm"}}}}
    cfg = config.resolve(config.deep_merge(variants, raw))
    strict = configure_stage().strict_options
    config.check_references(cfg, "params.yaml", tasks=TASKS, methods=REGISTRY, parse_options=strict)


def test_repository_params_name_only_known_models_tasks_and_methods():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for profile, experiment in every_run():
        check_references({**raw, "profile": profile, "experiment": experiment})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"evaluate": {"models": ["base", "lyerskip"]}},
         "evaluate.models: unknown model 'lyerskip'; allowed (base or a train.variants key): base, calm, layerskip"),
        ({"probe": {"models": ["clam"]}}, "probe.models: unknown model 'clam'"),
        ({"bench": {"models": ["draft"]}}, "bench.models: unknown model 'draft'"),
        ({"calibrate": {"models": ["x"]}}, "calibrate.models: unknown model 'x'"),
        ({"evaluate": {"tasks": {"gsm8k": {}}}},
         "evaluate.tasks: unknown task 'gsm8k'; registered: cnndm, humaneval, mbpp, topv2"),
        ({"calibrate": {"tasks": ["mbpp"]}, "data": {"tasks": ["cnndm", "humaneval", "topv2"]}},
         "calibrate.tasks: task 'mbpp' is not in data.tasks (cnndm, humaneval, topv2); add it there"),
        ({"bench": {"task": "topv3"}}, "bench.task: unknown task 'topv3'; registered: "),
        ({"bench": {"peers": ["hf_early_exitt"]}}, "bench.peers: unknown method 'hf_early_exitt'; registered: "),
        ({"evaluate": {"methods": {"greedy": {}}}}, "evaluate.methods: unknown method 'greedy'; registered: "),
        ({"evaluate": {"methods": {"early_exit": {"exit_layer": 3, "num_speculations": 2}}}},
         "evaluate.methods.early_exit: method 'early_exit': option 'num_speculations': Extra inputs are not"),
    ],
)
def test_unknown_model_task_or_method_is_one_line_naming_key_and_allowed(raw, expected):
    with pytest.raises(ExitbenchError) as info:
        check_references(raw)
    message = str(info.value)
    assert message.startswith("params.yaml (profile 'cpu'): ") and expected in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"evaluate": {"methods": {"early_exit": {"exit_layer": True}}}},
         "evaluate.methods.early_exit: method 'early_exit': option 'exit_layer': expected an integer, got true"),
        ({"evaluate": {"methods": {"self_speculative": {"exit_layer": 8, "num_speculations": "2"}}}},
         "option 'num_speculations': expected an integer, got \"2\" (text, not a number"),
        ({"evaluate": {"methods": {"layer_skip_draft": {"skip_layers": [2, False], "num_speculations": 1}}}},
         "option 'skip_layers.1': expected an integer, got false"),
        ({"throughput": {"methods": {"calm": {"threshold": True}}}},
         "throughput.methods.calm: method 'calm': option 'threshold': expected a number, got true"),
    ],
)
def test_method_option_of_the_wrong_type_is_one_line_naming_method_option_and_value(raw, expected):
    with pytest.raises(ExitbenchError) as info:
        check_references(raw)
    message = str(info.value)
    assert message.startswith("params.yaml (profile 'cpu'): ") and expected in message
    assert "\n" not in message


def test_method_options_take_ints_as_floats():
    assert configure_stage().strict_options("calm", {"threshold": 1}).threshold == 1.0


def write_params(tmp_path: Path, text: str) -> Path:
    params = tmp_path / "params.yaml"
    params.write_text(text)
    return params


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("\nprofile: cpu\n", "\nprofile: cpu\nprofile: smoke\n", "key 'profile' appears twice (lines {0} and {1})"),
        ("  seed: 1234\n", "  seed: 1234\n  seed: 7\n", "key 'seed' appears twice (lines {0} and {1}); keep one"),
        ("      recipe: plain\n", "      recipe: plain\n      recipe: calm\n",
         "key 'recipe' appears twice (lines {0} and {1})"),
    ],
)
def test_duplicated_key_in_params_file_is_refused_naming_key_and_lines(tmp_path, old, new, expected):
    text = (REPO / "params.yaml").read_text()
    assert text.count(old) == 1
    line = text[: text.index(old) + len(old.rstrip("\n"))].count("\n") + 1  # the key's line, the repeat's the next
    expected = expected.format(line, line + 1)
    params = write_params(tmp_path, text.replace(old, new))
    for read in (config.load, config.experiments_of):
        with pytest.raises(ExitbenchError) as info:
            read(params)
        assert str(info.value).startswith(f"{params}: {expected}")
        assert "\n" not in str(info.value)


def test_strict_loader_lets_a_merge_key_be_overridden():
    text = "a: &x {steps: 1, lr: 2}\nb: {<<: *x, steps: 3}\n"
    assert yaml.load(text, Loader=config.StrictLoader)["b"] == {"steps": 3, "lr": 2}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "is empty: it must be a mapping with 'profile' and the stage sections (see README \"Configuration\")"),
        ("# nothing but a comment\n", "is empty: it must be a mapping with 'profile'"),
        ("- profile: cpu\n", "must be a mapping at its top level, got a list"),
        ("cpu\n", "must be a mapping at its top level, got a string"),
    ],
)
def test_empty_or_non_mapping_params_file_says_so(tmp_path, text, expected):
    params = write_params(tmp_path, text)
    for read in (config.load, config.experiments_of):
        with pytest.raises(ExitbenchError) as info:
            read(params)
        assert str(info.value).startswith(f"{params} {expected}")


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


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("  seed: 1234", "  sed: 1234", "unknown key 'base.sed'"),
        ("\ncheck:\n", "\nchecks: {}\ncheck:\n", "unknown key 'checks'; allowed keys here: adapters, base, bench"),
        ("evaluate:\n  models: [base, plain, layerskip, calm]", "evaluate:\n  models: [base, plain, layerskip, clam]",
         "evaluate.models: unknown model 'clam'"),
        ("\nprofile: cpu\n", "\nprofile: cpu\nprofile: smoke\n", "key 'profile' appears twice (lines"),
        ("\n    early_exit@15: {exit_layer: 15}", "\n    early_exit@15: {exit_layer: true}",
         "evaluate.methods.early_exit@15: method 'early_exit@15': option 'exit_layer': expected an integer, got true"),
    ],
)
def test_wrong_key_in_params_file_is_one_line_without_traceback(tmp_path, old, new, expected):
    params = tmp_path / "params.yaml"
    text = (REPO / "params.yaml").read_text()
    assert text.count(old) == 1
    params.write_text(text.replace(old, new))
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
    assert expected in proc.stderr


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


def test_paper_topv2_experiment_trains_with_the_papers_topv2_settings():
    """The TOPv2 experiment's LayerSkip variant = replications/layerskip.yaml's TOPv2 finetune (Tables 8/9)."""
    runs = yaml.safe_load((REPO / "replications" / "layerskip.yaml").read_text())["training"]
    paper = next(run for run in runs if run["id"] == "topv2-llama-1.5b")
    cfg = config.load(REPO / "params.yaml", profile="paper", experiment="layerskip_topv2_llama32_1b")
    variant = cfg.train.variants["layerskip"]
    assert variant.source == "train" and variant.corpus == {"topv2": 1.0}
    assert variant.batch_size * variant.grad_accum == paper["batch_size"]
    assert (variant.steps, variant.lr, variant.p_max, variant.e_scale) == (
        paper["steps"], paper["lr"], paper["p_max"], paper["e_scale"]
    )
    assert variant.curriculum == paper["early_exit_curriculum"] and variant.dropout_schedule == "continual"
    assert not variant.freeze_embeddings  # the paper trains every weight
    plain = cfg.train.variants["plain"]
    assert plain.source == "train" and plain.recipe == "plain" and plain.p_max == 0
