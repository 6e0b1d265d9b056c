"""hf_extend: `posenc extend HF_DIR` writes a new transformers directory with rope_parameters; source untouched."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import torch
from hf_utils import save_tiny_model
from typer.testing import CliRunner

pytest.importorskip("transformers")

from posenc_cli.cli import app
from posenc_cli.config import ExtendConfig
from posenc_cli.errors import ConfigError
from posenc_cli.extension.hf_extend import RECORD_FILE, hf_rope_parameters
from posenc_cli.rope_scaling.yarn import YarnParams
from posenc_cli.run.hf_run import load_hf_run

runner = CliRunner()
METHODS = ["linear", "ntk", "dynamic", "yarn", "llama3"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf-extend")
    return {arch: save_tiny_model(root / arch, arch) for arch in ("llama", "gpt_neox", "gpt2")}


def _digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def _extend(*args: str):
    return runner.invoke(app, ["extend", *args], env={"COLUMNS": "200"})


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
@pytest.mark.parametrize("method", METHODS)
def test_extended_dir_loads_in_transformers_with_posenc_logits(
    sources: dict[str, Path], tmp_path: Path, arch: str, method: str
) -> None:
    from transformers import AutoModelForCausalLM

    src = sources[arch]
    before = _digest(src)
    out = tmp_path / "ext"
    result = _extend(str(src), f"--{method}", "--factor", "4", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert _digest(src) == before  # the source is never modified
    assert (out / "model.safetensors").stat().st_ino == (src / "model.safetensors").stat().st_ino  # hard link
    rope = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert rope["rope_type"] == {"ntk": "default"}.get(method, method)
    plain = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    run = load_hf_run(out)
    assert (run.meta.train_length, run.meta.base_length) == (32, 32)  # the parent's, from the record
    ids = torch.randint(0, 250, (1, 128), generator=torch.Generator().manual_seed(1))  # 4x the original length
    with torch.no_grad():
        torch.testing.assert_close(run.model(ids), plain(input_ids=ids).logits, rtol=0, atol=0)
        parent = AutoModelForCausalLM.from_pretrained(str(src)).eval()(input_ids=ids).logits
    assert not torch.allclose(parent, plain(input_ids=ids).logits)  # the scaling took effect


@pytest.mark.parametrize("method", ["linear", "ntk", "yarn", "llama3"])
def test_transformers_frequencies_equal_posenc_maths(sources: dict[str, Path], tmp_path: Path, method: str) -> None:
    from transformers import AutoModelForCausalLM

    from posenc_cli.rope_scaling.frequencies import scaled_inv_freq

    out = tmp_path / "ext"
    assert _extend(str(sources["llama"]), f"--{method}", "--factor", "8", "--out", str(out)).exit_code == 0
    rotary = AutoModelForCausalLM.from_pretrained(str(out)).model.rotary_emb
    ours, attention = scaled_inv_freq(method, 8, 10000.0, 8.0, 32)  # head dim 32 / 4 heads = 8
    torch.testing.assert_close(rotary.inv_freq.double(), ours.double(), rtol=1e-6, atol=0)
    assert rotary.attention_scaling == pytest.approx(attention)


def test_rope_parameter_mapping() -> None:
    current = {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}
    yarn, n = hf_rope_parameters(
        ExtendConfig(method="yarn", factor=4, params=YarnParams(beta_fast=16.0)), current, 100, 8
    )
    assert n == 400 and yarn == {
        "rope_theta": 500.0,
        "partial_rotary_factor": 0.5,
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 100,
        "beta_fast": 16.0,
        "beta_slow": 1.0,
        "truncate": True,
    }
    ntk, _ = hf_rope_parameters(ExtendConfig(method="ntk", factor=4), current, 100, 8)
    assert ntk["rope_theta"] == pytest.approx(500 * 4 ** (8 / 6))
    assert hf_rope_parameters(ExtendConfig(method="dynamic", factor=4), current, 100, 8)[1] == 100
    with pytest.raises(ConfigError, match="has no transformers rope type"):
        hf_rope_parameters(ExtendConfig(method="rerope"), current, 100, 8)  # type: ignore[arg-type]


def test_rerun_is_a_no_op_and_another_extension_is_refused(sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "ext"
    assert _extend(str(sources["llama"]), "--yarn", "--out", str(out)).exit_code == 0
    record = (out / RECORD_FILE).read_text()
    again = _extend(str(sources["llama"]), "--yarn", "--out", str(out))
    assert again.exit_code == 0 and "already extended" in again.output
    other = _extend(str(sources["llama"]), "--linear", "--out", str(out))
    assert other.exit_code == 2 and "different extension (other method: yarn there, linear asked" in " ".join(
        other.output.split()
    )
    assert (out / RECORD_FILE).read_text() == record


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("learned", "applies only to RoPE models"),
        ("finetune", "--finetune-steps is not supported"),
        ("corrupt", "weights could not be loaded"),
        ("no-tokenizer", "no tokenizer"),
    ],
)
def test_refusals_write_nothing(sources: dict[str, Path], tmp_path: Path, case: str, message: str) -> None:
    src = sources["gpt2"] if case == "learned" else sources["llama"]
    if case in ("corrupt", "no-tokenizer"):
        src = save_tiny_model(tmp_path / "src", "llama", tokenizer=case != "no-tokenizer")
        if case == "corrupt":
            weights = src / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[:-100])
    extra = ["--finetune-steps", "5"] if case == "finetune" else []
    out = tmp_path / "out"
    result = _extend(str(src), "--yarn", "--out", str(out), *extra)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and message in result.output
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_extend_eval_scores_parent_and_child(sources: dict[str, Path], tmp_path: Path, fake_stdlib: Path) -> None:
    out = tmp_path / "ext"
    result = _extend(str(sources["gpt_neox"]), "--yarn", "--factor", "2", "--out", str(out), "--eval")
    assert result.exit_code == 0, result.output
    assert "ext" in result.output and "gpt_neox" in result.output


def test_out_filled_meanwhile_is_one_line_and_leaves_no_temp(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import posenc_cli.extension.hf_extend as hf_extend

    def busy(src: object, dst: object) -> None:
        raise OSError(errno.ENOTEMPTY, "Directory not empty")

    monkeypatch.setattr(hf_extend.os, "replace", busy)
    result = _extend(str(sources["llama"]), "--yarn", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "written by another process meanwhile" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arch, pairs", [("llama", 4), ("gpt_neox", 2)])  # head dim 8; GPT-NeoX rotates half of it
def test_longrope_extension_loads_in_transformers_with_posenc_logits(
    sources: dict[str, Path], tmp_path: Path, arch: str, pairs: int
) -> None:
    """LongRoPE (per-pair factors from a file) is a rope type transformers has: same check as the other methods, in
    the long regime (4x the original length)."""
    from transformers import AutoModelForCausalLM

    factors = tmp_path / "factors.json"
    long = [1.0 + 3.0 * k / max(1, pairs - 1) for k in range(pairs)]  # 1 .. 4, non-decreasing over pairs
    factors.write_text(json.dumps({"short_factor": [1.0] * pairs, "long_factor": long}))
    out = tmp_path / "ext"
    result = _extend(str(sources[arch]), "--factors", str(factors), "--factor", "4", "--out", str(out))
    assert result.exit_code == 0, result.output
    rope = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert rope["rope_type"] == "longrope" and rope["long_factor"] == long
    plain = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    run = load_hf_run(out)
    ids = torch.randint(0, 250, (1, 128), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(run.model(ids), plain(input_ids=ids).logits, rtol=0, atol=0)


def test_the_new_directory_has_the_mode_mkdir_gives(sources: dict[str, Path], tmp_path: Path) -> None:
    """0o777 less the umask (here 0o027: 0o750), not mkdtemp's private 0o700."""
    old = os.umask(0o027)
    try:
        result = _extend(str(sources["llama"]), "--yarn", "--factor", "4", "--out", str(tmp_path / "ext"))
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((tmp_path / "ext").stat().st_mode) == 0o750


@pytest.mark.parametrize("method", METHODS)
def test_a_huge_factor_is_refused_in_one_line(sources: dict[str, Path], tmp_path: Path, method: str) -> None:
    out = tmp_path / "ext"
    result = _extend(str(sources["llama"]), f"--{method}", "--factor", "1e308", "--out", str(out))
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"--factor 1e+308 is out of range for {method}" in " ".join(result.output.split())
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ext.extend-")]


def test_another_extension_into_the_directory_is_refused_naming_what_differs(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "ext"
    assert _extend(str(sources["llama"]), "--yarn", "--factor", "4", "--out", str(out)).exit_code == 0
    before = _digest(out)
    result = _extend(str(sources["llama"]), "--yarn", "--factor", "8", "--out", str(out))
    assert result.exit_code == 2
    assert "different extension (other factor: 4 there, 8 asked;" in " ".join(result.output.split())
    assert _digest(out) == before
