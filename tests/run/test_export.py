"""export_run: transformers (the oracle) gives posenc's logits on the exported directory; refusals write nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from train_utils import tiny_config, write_corpus

from posenc_cli.config import ExtendConfig, TokenizerConfig, replace
from posenc_cli.data.tokenizer import ByteTokenizer
from posenc_cli.errors import ConfigError, NotExportable, UserError
from posenc_cli.extension.extend import extend_run
from posenc_cli.positional.rope import apply_rope, rope_cos_sin, rope_inv_freq
from posenc_cli.rope_scaling.llama3 import Llama3Params
from posenc_cli.rope_scaling.longrope import LongRopeParams
from posenc_cli.rope_scaling.yarn import YarnParams
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train

transformers = pytest.importorskip("transformers", reason="transformers is the test oracle (pip install transformers)")

from posenc_cli.run.export import (  # noqa: E402
    architecture,
    byte_level_alphabet,
    check_exportable,
    export_run,
    neox_qkv_rows,
)
from posenc_cli.run.export_rope import interleaved_to_half, neox_rope  # noqa: E402

L = 16  # training length of the tiny runs
TOL = 1e-4


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny runs (d=32, 2 layers, 2 heads, seq 16): learned, rope, an interleaved half-rotary bias-free rope, alibi."""
    root = tmp_path_factory.mktemp("export-runs")
    corpus = write_corpus(root)
    out = {name: root / name for name in ("learned", "rope", "rope_il", "alibi")}
    train(tiny_config(corpus, pos="learned", steps=4), out["learned"])
    train(tiny_config(corpus, pos="rope", steps=4), out["rope"])
    il = tiny_config(corpus, pos="rope", model={"bias": False}, steps=3)
    il = replace(il, pos=replace(il.pos, layout="interleaved", rotary_fraction=0.5, base=500.0))
    train(il, out["rope_il"])
    train(tiny_config(corpus, pos="alibi", steps=1), out["alibi"])
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exported")


def hf_model(directory: Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(str(directory)).float().eval()


def rope_params(directory: Path) -> dict:
    """The exported RoPE settings as transformers reads them (`rope_parameters` in 5.x, `rope_scaling` in 4.x)."""
    config = transformers.AutoConfig.from_pretrained(str(directory))
    return dict(getattr(config, "rope_parameters", None) or config.rope_scaling)


def assert_same_logits(run_dir: Path, hf_dir: Path, *lengths: int) -> None:
    """Logits of posenc and of a freshly loaded transformers model on random ids agree to TOL at each length.

    Lengths go up: transformers' dynamic RoPE keeps the frequencies of the longest input seen so far.
    """
    run, hf = load_run(run_dir), hf_model(hf_dir)
    for seed, length in enumerate(lengths):
        ids = torch.randint(0, run.tokenizer.vocab_size, (2, length), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            ours = run.model(ids)
            theirs = hf(input_ids=ids).logits
        assert theirs.shape == ours.shape
        diff = float((ours - theirs).abs().max())
        assert diff < TOL, f"max |Δlogit| {diff:.3g} at length {length}"
        assert float(ours.std()) > 1e-3  # the comparison is not between two constant outputs


# -- logits: transformers vs posenc --------------------------------------------------------------------------------


def test_learned_run_exports_as_gpt2_with_the_same_logits(runs: dict[str, Path], exported: Path) -> None:
    out = exported / "learned"
    result = export_run(runs["learned"], out)
    assert result.architecture == "GPT2LMHeadModel" and result.max_length == L
    assert result.max_abs_diff is not None and result.max_abs_diff < TOL
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["activation_function"] == "gelu"  # exact GELU, not tanh
    assert config["n_positions"] == L and config["tie_word_embeddings"] is True
    assert isinstance(hf_model(out), transformers.GPT2LMHeadModel)
    assert_same_logits(runs["learned"], out, 5, L)  # shorter than the table, and all of it


def test_rope_run_exports_as_sequential_gpt_neox_at_1x_and_4x(runs: dict[str, Path], exported: Path) -> None:
    out = exported / "rope"
    result = export_run(runs["rope"], out, verify=False)
    assert result.max_abs_diff is None
    assert result.architecture == "GPTNeoXForCausalLM" and result.rope_type == "default"
    config = json.loads((out / "config.json").read_text())
    assert config["use_parallel_residual"] is False and config["hidden_act"] == "gelu"
    model = hf_model(out)
    assert isinstance(model, transformers.GPTNeoXForCausalLM)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert_same_logits(runs["rope"], out, L, 4 * L)


def test_interleaved_partial_rotary_run_without_biases(runs: dict[str, Path], exported: Path) -> None:
    """Interleaved pairs are permuted to rotate_half, rotary_fraction 0.5 maps to 8 of 16 dims, biases are zero."""
    out = exported / "rope_il"
    export_run(runs["rope_il"], out, verify=False)
    assert hf_model(out).gpt_neox.layers[0].attention.rotary_ndims == 8
    assert_same_logits(runs["rope_il"], out, L, 4 * L)


def test_yarn_extended_run_maps_to_yarn_rope_parameters(runs: dict[str, Path], tmp_path: Path) -> None:
    child = tmp_path / "yarn"
    extend_run(runs["rope"], child, ExtendConfig(method="yarn", factor=4.0))
    out = tmp_path / "hf"
    result = export_run(child, out, verify=False)
    assert result.rope_type == "yarn"
    model = hf_model(out)
    params = rope_params(out)
    assert params["rope_type"] == "yarn" and params["factor"] == 4.0
    assert params["original_max_position_embeddings"] == L
    assert model.gpt_neox.rotary_emb.attention_scaling == pytest.approx(0.1 * torch.log(torch.tensor(4.0)) + 1)
    assert_same_logits(child, out, L, 4 * L)


@pytest.mark.parametrize(
    "ext",
    [
        ExtendConfig(method="linear", factor=4.0),
        ExtendConfig(method="ntk", factor=4.0),
        ExtendConfig(method="dynamic", factor=4.0),
        ExtendConfig(method="llama3", factor=4.0, params=Llama3Params(low_freq_factor=1.0, high_freq_factor=4.0)),
        ExtendConfig(
            method="yarn",
            factor=2.0,
            params=YarnParams(beta_fast=8.0, beta_slow=2.0, attention_factor=1.3, truncate=False),
        ),
    ],
    ids=["linear", "ntk", "dynamic", "llama3", "yarn-custom"],
)
def test_other_scalings_give_the_same_logits_at_4x(runs: dict[str, Path], tmp_path: Path, ext: ExtendConfig) -> None:
    child = tmp_path / "child"
    extend_run(runs["rope_il"], child, ext)  # partial rotary + interleaved: the hardest mapping
    export_run(child, tmp_path / "hf", verify=False)
    assert_same_logits(child, tmp_path / "hf", L, 4 * L)


def test_longrope_extended_run_carries_its_factors_and_gives_the_same_logits(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Short factors up to L, long ones beyond: transformers switches by length as posenc does (4 pairs here)."""
    short, long = [1.0, 1.05, 1.1, 1.3], [1.0, 1.8, 3.5, 5.0]
    child = tmp_path / "child"
    extend_run(
        runs["rope_il"],
        child,
        ExtendConfig(method="longrope", factor=4.0, params=LongRopeParams(short_factor=short, long_factor=long)),
    )
    result = export_run(child, tmp_path / "hf", verify=False)
    params = rope_params(tmp_path / "hf")
    assert result.rope_type == "longrope" and params["rope_type"] == "longrope"
    assert (params["short_factor"], params["long_factor"]) == (short, long)
    assert (params["factor"], params["original_max_position_embeddings"]) == (4.0, L)
    assert hf_model(tmp_path / "hf").gpt_neox.rotary_emb.attention_scaling == pytest.approx(
        (1 + torch.log(torch.tensor(4.0)) / torch.log(torch.tensor(float(L)))) ** 0.5
    )
    assert_same_logits(child, tmp_path / "hf", L // 2, L, 4 * L)  # short, short at L, then long


def test_finetuned_extension_keeps_its_original_length(runs: dict[str, Path], tmp_path: Path) -> None:
    """A fine-tuned child trains at L' = 32 but its YaRN ramp is L = 16's: original_max_position_embeddings = 16."""
    child = tmp_path / "child"
    extend_run(runs["rope"], child, ExtendConfig(method="yarn", factor=4.0, finetune_steps=2, finetune_seq_len=32))
    export_run(child, tmp_path / "hf", verify=False)
    assert rope_params(tmp_path / "hf")["original_max_position_embeddings"] == L
    assert_same_logits(child, tmp_path / "hf", 4 * L)


# -- tokenizers ----------------------------------------------------------------------------------------------------


def test_byte_tokenizer_loads_with_autotokenizer_and_gives_byte_ids(runs: dict[str, Path], exported: Path) -> None:
    out = exported / "tok"
    export_run(runs["rope"], out, verify=False)
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    text = "héllo wörld 😀\n\tcafé ñ ∑ \x00\x7f"
    assert tok(text)["input_ids"] == ByteTokenizer().encode(text).tolist()
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 256 and len(tok) == 257
    ids = tok("a<|endoftext|>b")["input_ids"]
    assert ids == [97, 256, 98]  # the special token string maps to end-of-document
    plain = tok("a<|endoftext|>b", split_special_tokens=True)["input_ids"]
    assert plain == ByteTokenizer().encode("a<|endoftext|>b").tolist()  # posenc's ids for that text


def test_byte_level_alphabet_is_the_tokenizers_byte_map() -> None:
    from tokenizers import pre_tokenizers

    alphabet = byte_level_alphabet()
    assert len(set(alphabet)) == 256 and set(alphabet) == set(pre_tokenizers.ByteLevel.alphabet())
    assert alphabet[ord("A")] == "A" and alphabet[ord(" ")] == "Ġ" and alphabet[ord("\n")] == "Ċ"  # GPT-2's map


def test_bpe_run_exports_its_tokenizer(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path)
    cfg = tiny_config(corpus, pos="learned", steps=2)
    cfg = replace(cfg, tokenizer=TokenizerConfig(kind="bpe", vocab_size=300))
    train(cfg, tmp_path / "run")
    run = load_run(tmp_path / "run")
    export_run(tmp_path / "run", tmp_path / "hf", verify=False)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    text = "the quick brown fox jumps over seven wizards"
    assert tok(text)["input_ids"] == run.tokenizer.encode(text).tolist()
    assert tok.eos_token_id == run.tokenizer.eod_id
    assert_same_logits(tmp_path / "run", tmp_path / "hf", L)


# -- refusals ------------------------------------------------------------------------------------------------------


def test_alibi_is_refused_and_nothing_is_written(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "hf"
    with pytest.raises(NotExportable, match="not exportable: no matching architecture in transformers"):
        export_run(runs["alibi"], out)
    assert list(tmp_path.iterdir()) == []


def test_rmsnorm_learned_is_refused_and_rmsnorm_rope_is_smollm3(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "corpus.txt", pos="learned", model={"norm": "rmsnorm"})
    with pytest.raises(NotExportable, match="model.norm=rmsnorm"):
        check_exportable(cfg)
    rope = tiny_config(tmp_path / "corpus.txt", pos="rope", model={"norm": "rmsnorm"})
    check_exportable(rope)
    assert architecture(rope) == "SmolLM3ForCausalLM"
    check_exportable(tiny_config(tmp_path / "corpus.txt", pos="rope", model={"bias": False}))  # zeros are exact


def test_output_directory_handling(runs: dict[str, Path], tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        export_run(runs["rope"], busy)
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        export_run(runs["rope"], a_file)
    with pytest.raises(ConfigError, match="--to onnx"):
        export_run(runs["rope"], tmp_path / "onnx", to="onnx")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = export_run(runs["rope"], empty, verify=False)  # an existing empty directory is fine
    assert "model.safetensors" in result.files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "empty", "file"]  # no temporary leftovers


# -- the mappings on their own -------------------------------------------------------------------------------------


def test_interleaved_rows_permuted_to_rotate_half_give_the_same_rotation() -> None:
    d, T = 8, 5
    x = torch.randn(2, T, d, generator=torch.Generator().manual_seed(0))
    cos_i, sin_i = rope_cos_sin(torch.arange(T), rope_inv_freq(d), "interleaved")
    cos_h, sin_h = rope_cos_sin(torch.arange(T), rope_inv_freq(d), "rotate_half")
    perm = interleaved_to_half(d)
    rotated = apply_rope(x, cos_i, sin_i, "interleaved")[..., perm]  # rotate, then permute
    torch.testing.assert_close(apply_rope(x[..., perm], cos_h, sin_h, "rotate_half"), rotated)


def test_neox_qkv_rows_group_q_k_v_per_head() -> None:
    rows = neox_qkv_rows(n_head=2, head_dim=2, rotary_dim=2, interleaved=False)
    # posenc rows: q = 0..3 (head 0: 0,1; head 1: 2,3), k = 4..7, v = 8..11
    assert rows.tolist() == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]
    rows = neox_qkv_rows(n_head=1, head_dim=6, rotary_dim=4, interleaved=True)
    assert rows.tolist() == [0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17]  # v untouched


def test_partial_rotary_factor_gives_transformers_the_same_rotary_dim() -> None:
    """transformers truncates head_dim · factor: for every valid (head dim, fraction) it must land on posenc's d."""
    from posenc_cli.positional.rope import RopeConfig, rotary_dim

    checked = 0
    for head_dim in range(4, 257, 2):
        for fraction in (0.1, 0.25, 1 / 3, 0.4, 0.5, 0.6, 2 / 3, 0.75, 0.9, 1.0):
            try:
                d = rotary_dim(head_dim, fraction)
            except ConfigError:
                continue
            _, _, partial, _ = neox_rope(RopeConfig(rotary_fraction=fraction), head_dim, L)
            assert int(head_dim * partial) == d, (head_dim, fraction)
            checked += 1
    assert checked > 500


def test_static_ntk_is_plain_rope_with_a_larger_base() -> None:
    from posenc_cli.positional.rope import RopeConfig
    from posenc_cli.rope_scaling import RopeScalingConfig
    from posenc_cli.rope_scaling.frequencies import scaled_inv_freq

    pos = RopeConfig(base=10000.0, scaling=RopeScalingConfig(method="ntk", factor=4.0, original_length=L))
    scaling, base, _, _ = neox_rope(pos, 16, L)
    assert scaling is None
    expected, _ = scaled_inv_freq("ntk", 16, 10000.0, 4.0, L)
    torch.testing.assert_close(rope_inv_freq(16, base), expected)


# -- faults ------------------------------------------------------------------------------------------------------


def test_verification_fails_on_nan_and_writes_nothing(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import posenc_cli.run.export as export_module

    monkeypatch.setattr(export_module, "verify_export", lambda run, hf_dir, length: (float("nan"), 1.0))
    with pytest.raises(UserError, match="export check failed"):
        export_run(runs["rope"], tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration  # subprocesses killed
def test_working_directories_of_killed_exports_are_removed(runs: dict[str, Path], tmp_path: Path) -> None:
    import subprocess

    from posenc_cli.run.export import _temp_prefix

    dead = subprocess.Popen(["true"])
    dead.wait()
    out = tmp_path / "hf"
    stale = tmp_path / f"{_temp_prefix(out, dead.pid)}abc123"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    alive = tmp_path / f"{_temp_prefix(out, os.getpid())}xyz"  # an export still running: left alone
    alive.mkdir()
    users = tmp_path / ".hf.export-mine"  # not posenc's naming: left alone
    users.mkdir()
    export_run(runs["rope"], out, verify=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, users.name, "hf"])
