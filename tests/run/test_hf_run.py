"""hf_run: a transformers directory loaded as a posenc run (scheme, lengths, token bytes, refusals, memory)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_utils import LINES, save_tiny_model, write_text_corpus

pytest.importorskip("transformers")

from posenc_cli.errors import CheckpointError
from posenc_cli.run.hf_run import (
    LengthBeyondMemory,
    forward_bytes,
    load_hf_run,
    token_byte_counts,
    train_length_override,
)
from posenc_cli.run.meta import is_hf_dir

ARCHS = ["llama", "gpt_neox", "gpt2", "qwen2"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-run")
    return {arch: save_tiny_model(root / arch, arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_loads_with_scheme_length_and_the_same_logits_as_transformers(dirs: dict[str, Path], arch: str) -> None:
    from transformers import AutoModelForCausalLM

    run = load_hf_run(dirs[arch])
    assert run.config.pos.name == ("learned" if arch == "gpt2" else "rope")
    assert run.meta.train_length == run.meta.base_length == 32 and run.meta.kind == "transformers"
    assert run.model.scheme.max_length == (32 if arch == "gpt2" else None)
    ids = torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(0))
    ref = AutoModelForCausalLM.from_pretrained(str(dirs[arch])).eval()
    with torch.no_grad():
        torch.testing.assert_close(run.model(ids), ref(input_ids=ids).logits, rtol=0, atol=0)


def test_training_length_prefers_original_and_can_be_overridden(tmp_path: Path) -> None:
    path = save_tiny_model(tmp_path / "m", "llama", max_pos=128)
    raw = json.loads((path / "config.json").read_text())
    raw["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 32}  # fmt: skip
    (path / "config.json").write_text(json.dumps(raw))
    assert load_hf_run(path).meta.train_length == 32
    assert load_hf_run(path, train_length=48).meta.base_length == 48
    with train_length_override(20):
        assert load_hf_run(path).config.train.seq_len == 20


def test_token_bytes_count_the_utf8_bytes_of_the_text(dirs: dict[str, Path]) -> None:
    tok = load_hf_run(dirs["llama"]).tokenizer
    text = LINES[2] + " — ünïcödé 日本"
    ids = tok.encode(text)
    assert int(tok.token_bytes[ids].sum()) == len(text.encode("utf-8"))
    docs = tok.encode_documents(["a b", "c"])
    assert list(docs).count(tok.eod_id) == 2 and tok.token_bytes[tok.eod_id] == 0
    assert tok.decode(tok.encode(text)) == text


def test_sentencepiece_style_byte_counts() -> None:
    vocab = {"\u2581the": 0, "<0xE2>": 1, "é": 2, "</s>": 3}

    class Special:
        special, content = True, "</s>"

    counts = token_byte_counts(vocab, {3: Special()}, 5)
    assert counts.tolist() == [4, 1, 2, 0, 0]


def _corrupt(path: Path) -> None:
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no-tokenizer", "no tokenizer"),
        ("bert", r"not a causal language model \(BertForMaskedLM\)"),
        ("auto-map", "needs remote code"),
        ("unknown-type", "unknown to transformers"),
        ("corrupt", "weights could not be loaded"),
        ("pickle-only", "posenc loads safetensors only"),
    ],
)
def test_refusals_are_one_line_checkpoint_errors(tmp_path: Path, case: str, message: str) -> None:
    path = save_tiny_model(tmp_path / case, "bert" if case == "bert" else "llama", tokenizer=case != "no-tokenizer")
    raw = json.loads((path / "config.json").read_text())
    if case == "auto-map":
        raw["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    if case == "unknown-type":
        raw["model_type"] = "my_private_arch"
    (path / "config.json").write_text(json.dumps(raw))
    if case == "corrupt":
        _corrupt(path)
    if case == "pickle-only":
        (path / "model.safetensors").rename(path / "pytorch_model.bin")
    before = sorted(p.name for p in path.iterdir())
    assert is_hf_dir(path)
    with pytest.raises(CheckpointError, match=message) as err:
        load_hf_run(path)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in path.iterdir()) == before


def test_memory_check_refuses_before_the_forward(dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import posenc_cli.run.hf_run as hf_run

    run = load_hf_run(dirs["llama"])
    one = forward_bytes(1, 24, vocab=run.tokenizer.vocab_size, hidden=32, ffn=64, heads=4, eager=False)
    monkeypatch.setattr(hf_run, "available_memory", lambda device: int(1.5 * one))
    called: list[int] = []
    run.model.hf.register_forward_pre_hook(lambda *a: called.append(1))
    with pytest.raises(LengthBeyondMemory, match="lower --batch-tokens to 24"):
        run.model(torch.zeros(4, 24, dtype=torch.long))
    assert called == []
    assert run.model(torch.zeros(1, 24, dtype=torch.long)).shape[:2] == (1, 24)


def test_forward_bytes_grows_with_logits_and_eager_attention() -> None:
    sdpa = forward_bytes(1, 8192, vocab=32000, hidden=768, ffn=2048, heads=12, eager=False)
    eager = forward_bytes(1, 8192, vocab=32000, hidden=768, ffn=2048, heads=12, eager=True)
    assert sdpa >= 2 * 8192 * 32000 * 4 and eager - sdpa >= 2 * 12 * 8192**2 * 4 - 8192**2
    assert np.isclose(forward_bytes(2, 8192, vocab=32000, hidden=768, ffn=2048, heads=12, eager=False), 2 * sdpa)


# ----------------------------------------------------------------------------------------------------------------
# Through the CLI: eval-extrapolate on a transformers directory.


def _eval(*args: str):
    from typer.testing import CliRunner

    from posenc_cli.cli import app

    return CliRunner().invoke(app, ["eval-extrapolate", *args], env={"COLUMNS": "200"})


@pytest.mark.parametrize("arch", ARCHS)
def test_cli_evaluates_at_1x_and_4x(dirs: dict[str, Path], arch: str, tmp_path: Path) -> None:

    corpus = write_text_corpus(tmp_path)
    json_out = tmp_path / "all.json"
    data = ["data=text", f"data.paths=[{corpus}]", "data.val_fraction=0.5"]
    result = _eval(str(dirs[arch]), "--lengths", "1,4", "--tokens", "256", "--json", str(json_out), *data)
    assert result.exit_code == 0, result.output
    (run,) = json.loads(json_out.read_text())["runs"]
    status = [(e["length"], e["status"]) for e in run["entries"]]
    assert status == [(32, "ok"), (128, "n/a" if arch == "gpt2" else "ok")]
    assert run["scheme"] == ("learned" if arch == "gpt2" else "rope") and run["base_length"] == 32
    assert all(e["bpb"] > 0 for e in run["entries"] if e["status"] == "ok")
    assert (dirs[arch] / "eval" / "extrapolate.json").is_file()


def test_cli_train_length_option_sets_the_base_length(dirs: dict[str, Path], tmp_path: Path) -> None:

    corpus = write_text_corpus(tmp_path)
    json_out = tmp_path / "all.json"
    args = ["--lengths", "1", "--tokens", "64", "--train-length", "16", "--json", str(json_out)]
    result = _eval(str(dirs["llama"]), *args, "data=text", f"data.paths=[{corpus}]", "data.val_fraction=0.5")
    assert result.exit_code == 0, result.output
    assert [e["length"] for e in json.loads(json_out.read_text())["runs"][0]["entries"]] == [16]


def test_cli_refusal_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    path = save_tiny_model(tmp_path / "bert", "bert")
    before = sorted(p.name for p in path.rglob("*"))
    result = _eval(str(path), "--lengths", "1")
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and "not a causal language model" in result.output
    assert sorted(p.name for p in path.rglob("*")) == before


def test_cli_memory_refusal_is_one_line(dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import posenc_cli.run.hf_run as hf_run

    monkeypatch.setattr(hf_run, "available_memory", lambda device: 1000)
    corpus = write_text_corpus(tmp_path)
    args = ["--lengths", "4", "--tokens", "64", "--force", "data=text", f"data.paths=[{corpus}]"]
    result = _eval(str(dirs["qwen2"]), *args)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and "more than the 0.0 GiB available" in result.output


def test_cli_bf16_evaluates_close_to_fp32(dirs: dict[str, Path], tmp_path: Path) -> None:
    corpus = write_text_corpus(tmp_path)
    data = ["data=text", f"data.paths=[{corpus}]", "data.val_fraction=0.5", "--force"]
    ppl = {}
    for dtype in ("fp32", "bf16"):
        out = tmp_path / f"{dtype}.json"
        args = ["--lengths", "1", "--tokens", "64", "--dtype", dtype, "--json", str(out)]
        result = _eval(str(dirs["llama"]), *args, *data)
        assert result.exit_code == 0, result.output
        (entry,) = json.loads(out.read_text())["runs"][0]["entries"]
        assert entry["dtype"] == dtype
        ppl[dtype] = entry["ppl"]
    assert ppl["bf16"] == pytest.approx(ppl["fp32"], rel=0.05)


# -- config.json that does not fit its weights, its tokenizer or the machine: refused before anything is built ------


def _edit_config(path: Path, **changes: object) -> Path:
    raw = json.loads((path / "config.json").read_text())
    raw.update(changes)
    (path / "config.json").write_text(json.dumps(raw))
    return path


def test_a_config_describing_100000_layers_is_refused_before_building(tmp_path: Path) -> None:
    import posenc_cli.run.hf_run as hf_run

    path = _edit_config(save_tiny_model(tmp_path / "m", "llama"), num_hidden_layers=100_000)
    assert hf_run.config_parameters(json.loads((path / "config.json").read_text())) > 9e8
    before = sorted(p.name for p in path.iterdir())
    with pytest.raises(CheckpointError, match=r"num_hidden_layers=100000.*describes at least 9.\d+e\+08 parameters"):
        load_hf_run(path)
    result = _eval(str(path), "--lengths", "1")
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and "does not belong to these weights" in result.output
    assert sorted(p.name for p in path.iterdir()) == before


def test_a_model_larger_than_memory_is_refused_before_building(
    dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import posenc_cli.run.hf_run as hf_run

    raw = json.loads((dirs["llama"] / "config.json").read_text())
    stored = hf_run.stored_parameters(dirs["llama"])
    assert 0 < hf_run.config_parameters(raw) <= stored  # a lower bound, for every family in the tests
    for arch in ARCHS:
        assert hf_run.config_parameters(json.loads((dirs[arch] / "config.json").read_text())) <= sum(
            p.numel() for p in load_hf_run(dirs[arch]).model.parameters()
        )
    monkeypatch.setattr(hf_run, "cpu_available_memory", lambda: 4 * stored)  # less than 4 bytes / 0.9 per param
    with pytest.raises(CheckpointError, match=r"parameters need about .* in fp32 and 0.0 GiB of memory is available"):
        load_hf_run(dirs["llama"])


def test_a_vocab_size_below_the_tokenizers_is_refused_at_load(tmp_path: Path) -> None:
    import transformers as tf
    from hf_utils import tiny_config, tiny_tokenizer

    tok = tiny_tokenizer()
    path = tmp_path / "m"
    tf.AutoModelForCausalLM.from_config(tiny_config("llama", 100)).save_pretrained(str(path))  # 100 rows, ~300 ids
    tok.save_pretrained(str(path))
    with pytest.raises(
        CheckpointError, match=r"the tokenizer produces ids up to \d+ but the model's vocab_size is 100"
    ):
        load_hf_run(path)
    result = _eval(str(path), "--lengths", "1")
    assert result.exit_code == 2 and "IndexError" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "vocab_size is 100" in result.output


def test_a_sliding_window_is_the_training_length(tmp_path: Path) -> None:
    """Mistral-7B-v0.1: sliding_window 4096, max_position_embeddings 32768 -> 4096 (microsoft/LongRoPE's rule)."""
    from posenc_cli.run.hf_run import _config_length

    mistral = {"model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 32768}
    assert _config_length(mistral) == 4096
    assert _config_length({**mistral, "sliding_window": None}) == 32768  # Mistral v0.2+
    assert _config_length({**mistral, "sliding_window": 65536}) == 32768  # a window longer than the context
    qwen2 = {"model_type": "qwen2", "sliding_window": 4096, "max_position_embeddings": 32768}
    assert _config_length({**qwen2, "use_sliding_window": False}) == 32768
    assert _config_length({"model_type": "gemma2", "sliding_window": 4096, "max_position_embeddings": 8192}) == 8192
    mixed = {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096, "num_hidden_layers": 2,
             "max_window_layers": 1, "max_position_embeddings": 32768}  # fmt: skip
    assert _config_length(mixed) == 32768  # layer 0 attends globally
    assert _config_length({**mixed, "max_window_layers": 0}) == 4096  # every layer slides
    scaled = {**mistral, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}}
    assert _config_length(scaled) == 8192
    path = _edit_config(save_tiny_model(tmp_path / "m", "llama", max_pos=64), sliding_window=16, model_type="mistral",
                        architectures=["MistralForCausalLM"])  # fmt: skip
    run = load_hf_run(path)
    assert run.meta.train_length == run.meta.base_length == 16 and run.config.train.seq_len == 16


@pytest.mark.parametrize("case", ["fifo", "deep", "big", "not-json"])
def test_a_hostile_config_json_is_one_line(tmp_path: Path, case: str) -> None:
    import os

    path = save_tiny_model(tmp_path / "m", "llama")
    config = path / "config.json"
    config.unlink()
    if case == "fifo":
        os.mkfifo(config)  # nobody writes it: reading it would block forever
    elif case == "deep":
        config.write_text("[" * 200_000 + "]" * 200_000)
    elif case == "big":
        config.write_text(json.dumps({"model_type": "llama", "pad": "x" * (5 * 2**20)}))
    else:
        config.write_text("{model_type: llama")
    message = {"fifo": "not a regular file", "deep": "nested deeper", "big": "larger than 4 MiB", "not-json": "JSON"}
    with pytest.raises(CheckpointError, match=message[case]) as err:
        load_hf_run(path)
    assert "\n" not in str(err.value) and str(config) in str(err.value)
