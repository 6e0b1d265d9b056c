"""extend_run: refusals, the child run directory, the scaled model it loads to, idempotency and the fine-tune."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from train_utils import nan_loss_at, tiny_config, write_corpus

from posenc_cli.config import ExtendConfig, replace
from posenc_cli.errors import ConfigError, UserError
from posenc_cli.extension.extend import extend_run
from posenc_cli.model import build_model
from posenc_cli.rope_scaling.frequencies import frequency_regions, scaled_inv_freq
from posenc_cli.rope_scaling.llama3 import Llama3Params
from posenc_cli.rope_scaling.longrope import LongRopeParams
from posenc_cli.rope_scaling.yarn import YarnParams
from posenc_cli.run.layout import MODEL_FILE
from posenc_cli.run.load import load_run
from posenc_cli.run.meta import read_meta
from posenc_cli.run.train import TrainingDiverged, train

L = 16  # the parents' training length
HEAD_DIM = 16  # d_model 32 / 2 heads


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A RoPE and an ALiBi parent (d=32, 2 layers, seq 16), trained a few steps on a tmp text corpus."""
    root = tmp_path_factory.mktemp("extend")
    corpus = write_corpus(root)
    out = {}
    for pos, steps in (("rope", 8), ("alibi", 2)):
        out[pos] = root / pos
        train(tiny_config(corpus, pos=pos, steps=steps), out[pos])
    return out


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (2, n), generator=torch.Generator().manual_seed(seed))


def yarn_reference(d: int, base: float, s: float, L: int) -> tuple[torch.Tensor, float]:
    """YaRN inverse frequencies and attention factor written from the reference sheet (truncate, β = 32, 1)."""

    def dim(r: float) -> float:
        return d * math.log(L / (2 * math.pi * r)) / (2 * math.log(base))

    low, high = max(math.floor(dim(32)), 0), min(math.ceil(dim(1)), d - 1)
    high = high + 0.001 if low == high else high
    inv = [base ** (-2 * k / d) for k in range(d // 2)]
    ramp = [min(max((k - low) / (high - low), 0.0), 1.0) for k in range(d // 2)]
    scaled = [(i / s) * r + i * (1 - r) for i, r in zip(inv, ramp, strict=True)]
    return torch.tensor(scaled, dtype=torch.float64), 0.1 * math.log(s) + 1


# -- refusals: one clear UserError, nothing written ----------------------------------------------------------------


def test_alibi_run_is_refused_and_nothing_is_written(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "child"
    before = snapshot(runs["alibi"])
    with pytest.raises(ConfigError, match=r"pos=alibi.*only to RoPE"):
        extend_run(runs["alibi"], out, ExtendConfig())
    assert not out.exists()
    assert snapshot(runs["alibi"]) == before


@pytest.mark.parametrize("factor", [1.0, 0.5])
def test_factor_at_most_one_is_refused(runs: dict[str, Path], tmp_path: Path, factor: float) -> None:
    with pytest.raises(ConfigError, match="factor must be > 1"):
        extend_run(runs["rope"], tmp_path / "child", ExtendConfig(factor=factor))
    assert not (tmp_path / "child").exists()


def test_unknown_method_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown scaling method 'nosuch'"):
        extend_run(runs["rope"], tmp_path / "child", ExtendConfig(method="nosuch"))  # type: ignore[arg-type]
    assert not (tmp_path / "child").exists()


def test_longrope_factors_of_the_wrong_length_are_refused_before_writing(runs: dict[str, Path], tmp_path: Path) -> None:
    ext = ExtendConfig(method="longrope", factor=4.0, params=LongRopeParams(long_factor=[1.0, 2.0, 3.0]))
    with pytest.raises(ConfigError, match="long_factor has 3 values; this RoPE has"):
        extend_run(runs["rope"], tmp_path / "child", ext)
    assert not (tmp_path / "child").exists()


def test_bad_llama3_parameters_are_refused_before_writing(runs: dict[str, Path], tmp_path: Path) -> None:
    ext = ExtendConfig(method="llama3", params=Llama3Params(low_freq_factor=4.0, high_freq_factor=1.0))
    with pytest.raises(ConfigError, match="low_freq_factor < high_freq_factor"):
        extend_run(runs["rope"], tmp_path / "child", ext)
    assert not (tmp_path / "child").exists()


def test_non_empty_out_dir_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "child"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        extend_run(runs["rope"], out, ExtendConfig())
    assert snapshot(out) == {"notes.txt": b"mine"}


def test_the_parent_itself_is_refused_as_out_dir(runs: dict[str, Path]) -> None:
    before = snapshot(runs["rope"])
    with pytest.raises(UserError, match="never modifies its source"):
        extend_run(runs["rope"], runs["rope"], ExtendConfig())
    assert snapshot(runs["rope"]) == before


def test_a_different_extension_in_out_dir_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "child"
    extend_run(runs["rope"], out, ExtendConfig(method="linear", factor=2))
    before = snapshot(out)
    with pytest.raises(ConfigError, match="different extension"):
        extend_run(runs["rope"], out, ExtendConfig(method="linear", factor=4))
    assert snapshot(out) == before
    plain = snapshot(runs["alibi"])
    with pytest.raises(ConfigError, match="not an extension"):  # a plain training run in the out dir
        extend_run(runs["rope"], runs["alibi"], ExtendConfig())
    assert snapshot(runs["alibi"]) == plain


# -- the child run directory ---------------------------------------------------------------------------------------


def test_child_config_meta_and_weights(runs: dict[str, Path], tmp_path: Path) -> None:
    parent_before = snapshot(runs["rope"])
    out = tmp_path / "child"
    out.mkdir()  # an existing empty directory (as Hydra creates job dirs) is fine
    res = extend_run(runs["rope"], out, ExtendConfig(method="yarn", factor=4, params=YarnParams(beta_fast=16.0)))
    assert res.status == "created"
    assert snapshot(runs["rope"]) == parent_before  # the source is never modified

    child, parent = load_run(out), load_run(runs["rope"])
    s = child.config.pos.scaling  # type: ignore[attr-defined]
    assert (s.method, s.factor, s.original_length, s.params.beta_fast, s.params.beta_slow, s.params.truncate) == (
        "yarn", 4.0, L, 16.0, 1.0, True
    )  # fmt: skip
    assert parent.config.pos.scaling.method == "none"  # type: ignore[attr-defined]
    assert child.config.train == parent.config.train  # no fine-tune: same training length
    assert child.meta.parent == str(runs["rope"].resolve())
    assert child.meta.base_length == parent.meta.base_length == L
    assert child.meta.train_length == L
    assert child.meta.kind == "posenc-run"
    assert (out / MODEL_FILE).read_bytes() == (runs["rope"] / MODEL_FILE).read_bytes()
    assert child.meta.files[MODEL_FILE] == parent.meta.files[MODEL_FILE]
    assert res.regions == frequency_regions("yarn", HEAD_DIM, 10000.0, 4.0, L, beta_fast=16.0)
    assert sum(res.regions.values()) == HEAD_DIM // 2
    assert res.attention_factor == pytest.approx(0.1 * math.log(4) + 1)


def test_yarn_child_is_the_hand_built_scaled_model(runs: dict[str, Path], tmp_path: Path) -> None:
    extend_run(runs["rope"], tmp_path / "child", ExtendConfig(method="yarn", factor=4))
    child, parent = load_run(tmp_path / "child"), load_run(runs["rope"])
    inv_ref, attn_ref = yarn_reference(HEAD_DIM, 10000.0, 4.0, L)

    inv, attn = child.model.scheme.frequencies(L)  # type: ignore[operator]
    torch.testing.assert_close(inv.double(), inv_ref, rtol=1e-6, atol=0.0)
    assert attn == pytest.approx(attn_ref)
    ours, _ = scaled_inv_freq("yarn", HEAD_DIM, 10000.0, 4.0, L)
    assert torch.equal(inv, ours)

    # the parent's weights in an unscaled model whose RoPE tables are replaced by the reference ones, by hand
    by_hand = build_model(parent.config, parent.tokenizer.vocab_size).eval()
    by_hand.load_state_dict(parent.model.state_dict())
    by_hand.scheme.frequencies = lambda seq_len: (inv_ref.float(), attn_ref)  # type: ignore[method-assign]
    x = tokens(L)
    with torch.no_grad():
        got, want, base = child.model(x), by_hand(x), parent.model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - base).abs().max() > 1e-3  # scaling changes the model at its own training length


def test_dynamic_child_equals_parent_up_to_original_length(runs: dict[str, Path], tmp_path: Path) -> None:
    res = extend_run(runs["rope"], tmp_path / "child", ExtendConfig(method="dynamic", factor=4))
    assert res.attention_factor == 1.0
    child, parent = load_run(tmp_path / "child"), load_run(runs["rope"])
    with torch.no_grad():
        torch.testing.assert_close(child.model(tokens(L)), parent.model(tokens(L)))
        assert (child.model(tokens(4 * L)) - parent.model(tokens(4 * L))).abs().max() > 1e-3


def test_llama3_with_explicit_original_length(runs: dict[str, Path], tmp_path: Path) -> None:
    ext = ExtendConfig(method="llama3", factor=8, original_length=256)
    res = extend_run(runs["rope"], tmp_path / "child", ext)
    assert res.original_length == 256
    assert res.regions == frequency_regions("llama3", HEAD_DIM, 10000.0, 8.0, 256)
    assert res.regions["keep"] > 0 and res.regions["interpolate"] > 0
    child = load_run(tmp_path / "child")
    inv, _ = child.model.scheme.frequencies(L)  # type: ignore[operator]
    assert torch.equal(inv, scaled_inv_freq("llama3", HEAD_DIM, 10000.0, 8.0, 256)[0])


def test_rerun_is_idempotent(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "child"
    extend_run(runs["rope"], out, ExtendConfig(method="ntk", factor=2))
    before = snapshot(out)
    again = extend_run(runs["rope"], out, ExtendConfig(method="ntk", factor=2), threads=1)
    assert again.status == "already_complete"
    assert snapshot(out) == before


def test_resume_requires_an_existing_extension(runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no extension to resume"):
        extend_run(runs["rope"], tmp_path / "child", ExtendConfig(), resume=True)
    assert not (tmp_path / "child").exists()


# -- fine-tune --------------------------------------------------------------------------------------------------


def test_finetune_child_lengths_resume_and_reextension(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "ft"
    ext = ExtendConfig(method="yarn", factor=4, finetune_steps=3, finetune_lr=1e-4, finetune_warmup=1)

    with nan_loss_at(2), pytest.raises(TrainingDiverged):  # the fine-tune dies at step 2, after its first checkpoint
        extend_run(runs["rope"], out, ext, threads=1)
    assert read_meta(out)["status"] == "running"

    res = extend_run(runs["rope"], out, ext, threads=1)  # the same command resumes it
    assert res.status == "finetuned"
    assert res.finetune is not None and res.finetune.step == 3
    child, parent = load_run(out), load_run(runs["rope"])
    assert child.meta.train_length == 4 * L == child.config.train.seq_len
    assert child.meta.base_length == L
    assert child.meta.parent == str(runs["rope"].resolve())
    assert (child.config.train.steps, child.config.train.lr) == (3, 1e-4)
    assert child.config.pos.scaling.original_length == L  # type: ignore[attr-defined]  # not L'
    moved = [k for k, v in child.model.state_dict().items() if not torch.equal(v, parent.model.state_dict()[k])]
    assert moved  # the weights were trained

    assert extend_run(runs["rope"], out, ext).status == "already_complete"

    # a fine-tuned child extended again: L defaults to its own training length, the base length stays the root's
    again = extend_run(out, tmp_path / "again", ExtendConfig(method="linear", factor=2))
    assert again.original_length == 4 * L
    assert again.parent_scaling == f"yarn x4 (L={L})"
    grandchild = load_run(tmp_path / "again")
    assert grandchild.meta.base_length == L and grandchild.meta.train_length == 4 * L
    assert grandchild.config.pos.scaling.method == "linear"  # type: ignore[attr-defined]


def test_finetune_with_explicit_length(runs: dict[str, Path], tmp_path: Path) -> None:
    ext = ExtendConfig(method="linear", factor=2, finetune_steps=2, finetune_seq_len=24)
    res = extend_run(runs["rope"], tmp_path / "ft", ext, threads=1)
    assert res.train_length == 24 == read_meta(tmp_path / "ft")["train_length"]
    assert os.path.isfile(tmp_path / "ft" / "state.safetensors")  # resumable like any training run
    # the same settings with a different length are a different extension
    with pytest.raises(ConfigError, match="different extension"):
        extend_run(runs["rope"], tmp_path / "ft", replace(ext, finetune_seq_len=32))


def test_tokenizer_file_is_copied(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path)
    cfg = tiny_config(corpus, pos="rope", steps=1)
    cfg = replace(cfg, tokenizer=replace(cfg.tokenizer, kind="bpe", vocab_size=300))
    train(cfg, tmp_path / "bpe")
    extend_run(tmp_path / "bpe", tmp_path / "child", ExtendConfig(method="linear", factor=2))
    assert (tmp_path / "child" / "tokenizer.json").read_bytes() == (tmp_path / "bpe" / "tokenizer.json").read_bytes()
    child = load_run(tmp_path / "child")  # verifies the tokenizer's fingerprint against meta.json
    assert child.tokenizer.vocab_size == 300


# -- concurrent and half-written extensions ------------------------------------------------------------------------


def test_a_second_writer_changes_nothing_and_says_so(runs: dict[str, Path], tmp_path: Path) -> None:
    from filelock import FileLock

    from posenc_cli.extension.child_run import LOCK_FILE

    out = tmp_path / "child"
    out.mkdir()
    with FileLock(out / LOCK_FILE):  # another `extend` is writing this directory
        before = snapshot(out)
        with pytest.raises(UserError, match="being written by another posenc extend; nothing was changed"):
            extend_run(runs["rope"], out, ExtendConfig(method="linear", factor=2))
        assert snapshot(out) == before
    assert extend_run(runs["rope"], out, ExtendConfig(method="linear", factor=2)).status == "created"


def test_a_half_written_extension_is_redone_not_reported_done(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "child"
    extend_run(runs["rope"], out, ExtendConfig(method="linear", factor=2))
    for name in ("model.safetensors", "config.yaml"):  # what a raced or killed writer left: meta.json alone
        (out / name).unlink()
    assert extend_run(runs["rope"], out, ExtendConfig(method="linear", factor=2)).status == "created"
    assert load_run(out).config.pos.scaling.factor == 2.0  # type: ignore[attr-defined]
