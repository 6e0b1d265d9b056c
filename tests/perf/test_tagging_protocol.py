"""benchmarks/tagging_protocol.py: the tags are the running products, the model reads causally, a 2-step run's rows."""

from __future__ import annotations

import json
from functools import reduce
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark

from posenc_cli.data.algorithmic.state_tracking import IDENTITY, compose, elements


@pytest.fixture(scope="module")
def tp() -> ModuleType:
    return load_benchmark("tagging_protocol")


@pytest.mark.parametrize("group", ["S5", "A5"])
def test_every_tag_is_the_running_product_of_the_inputs_so_far(tp: ModuleType, group: str) -> None:
    elems = elements(group)
    x, y = tp.sample_batch(group, np.random.default_rng(0), 6, 8)
    assert x.shape == y.shape == (8, 7)
    assert (x[:, 0] == len(elems)).all() and (y[:, 0] == tp.IGNORE).all()  # BOS, untagged
    for xs, ys in zip(x[:, 1:].tolist(), y[:, 1:].tolist(), strict=True):
        for t in range(1, 7):
            product = reduce(compose, (elems[i] for i in xs[:t]), IDENTITY)  # x_1·…·x_t by posenc's own compose
            assert elems[ys[t - 1]] == product


@pytest.mark.parametrize("pos", ["rope", "path"])
def test_a_position_does_not_see_later_inputs(tp: ModuleType, pos: str) -> None:
    options = tp.Options(max_length=4, steps=1)
    torch.manual_seed(0)
    model = tp.build_model(tp.model_config(options, pos), 121).eval()
    base = torch.tensor([[120, 5, 17, 42, 99]])
    later = base.clone()
    later[0, 3:] = torch.tensor([7, 8])  # inputs after position 2
    with torch.no_grad():
        a, b = model(base), model(later)
    assert torch.allclose(a[0, :3], b[0, :3], atol=1e-5)  # positions 0..2 unchanged
    assert not torch.allclose(a[0, 3], b[0, 3])  # the changed position itself does change


def test_a_two_step_run_fills_every_length_and_scheme(tp: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "tagging.json"
    argv = ["--pos", "rope,nope", "--max-length", "3", "--steps", "2", "--batch", "4", "--eval-examples", "5"]
    assert tp.main([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["schemes"]) == {"rope", "nope"}
    for r in result["schemes"].values():
        assert sorted(map(int, r["per_length"])) == [2, 3, 4, 5, 6]  # 2..K and K+1..2K
        for s in r["per_length"].values():
            assert 0 <= s["sequence_accuracy"] <= s["token_accuracy"] <= 1
    table = tp.markdown(result).splitlines()
    assert len(table) == 4 and table[2].startswith("| rope |") and "n/a" not in table[3]


def test_an_unknown_scheme_or_group_is_one_line_and_exit_2(tp: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert tp.main(["--pos", "rope,nosuch"]) == 2
    assert tp.main(["--group", "S4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "nosuch" in err[0] and "S4" in err[1]
