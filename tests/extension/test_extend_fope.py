"""extend_run on a FoPE run: PI or YaRN scale its kept frequencies (the FoPE code's `len_extra`), the coefficients
are the parent's, the clip stays at the parent's length; the other methods are refused in one line, before writing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_utils import tiny_config, write_corpus

from posenc_cli.config import ExtendConfig
from posenc_cli.errors import ConfigError
from posenc_cli.extension.extend import extend_run
from posenc_cli.positional.fope import FoPE, kept_frequencies
from posenc_cli.rope_scaling.frequencies import scaled_inv_freq
from posenc_cli.run.load import load_run
from posenc_cli.run.train import train

HEAD_DIM = 32  # d_model 64 / 2 heads


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("extend-fope")
    out = root / "fope"
    train(tiny_config(write_corpus(root), pos="fope", model={"d_model": 64}, steps=4), out)
    return out


@pytest.mark.parametrize("method", ["yarn", "linear"])
def test_a_fope_child_scales_the_kept_frequencies_and_keeps_the_coefficients(
    parent: Path, tmp_path: Path, method: str
) -> None:
    extend_run(parent, tmp_path / "child", ExtendConfig(method=method, factor=4))
    child, before = load_run(tmp_path / "child"), load_run(parent)
    L = before.config.train.seq_len
    assert isinstance(child.model.scheme, FoPE) and child.config.pos.scaling.original_length == L
    kept = kept_frequencies(HEAD_DIM, 10000.0, L)
    inv, attn = child.model.scheme.frequencies(4 * L)
    want, want_attn = scaled_inv_freq(method, HEAD_DIM, 10000.0, 4.0, L)
    assert torch.equal(inv, want[kept]) and attn == want_attn
    parent_state, child_state = before.model.scheme.state_dict(), child.model.scheme.state_dict()
    assert all(torch.equal(parent_state[k], child_state[k]) for k in parent_state)
    x = torch.randint(0, 256, (1, L))
    with torch.no_grad():
        assert (child.model(x) - before.model(x)).abs().max() > 1e-4


def test_a_method_the_fope_code_does_not_apply_is_refused_before_writing(parent: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pos=fope takes pos.scaling.method linear or yarn"):
        extend_run(parent, tmp_path / "child", ExtendConfig(method="ntk", factor=4))
    assert not (tmp_path / "child").exists()
