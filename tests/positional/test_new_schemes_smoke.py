"""The six schemes added after the core five plug in through the hooks alone: registry, `posenc schemes`, Hydra
selection; and every registered scheme in a real run: 20 training steps with falling loss, then evaluation at 4× the
training length. Causality, chunked attention and bf16 autocast are checked for every scheme in
`test_scheme_contract.py`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from scheme_utils import n_layer_for
from train_utils import metrics, tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.config import EvalConfig, ModelConfig
from posenc_cli.model import GPT
from posenc_cli.positional import config_class, registry

LEARNED = {"t5": "yes", "xpos": "no", "kerple": "yes", "fire": "yes", "sandwich": "no", "cope": "yes"}
TINY = ModelConfig(d_model=32, n_layer=2, n_head=2)


def make(name: str, train_length: int = 16, seed: int = 0, n_layer: int = TINY.n_layer) -> GPT:
    torch.manual_seed(seed)
    return GPT(dataclasses.replace(TINY, n_layer=n_layer), config_class(name)(), 48, train_length).eval()


def test_registered_and_listed_by_posenc_schemes() -> None:
    from posenc_cli.api import schemes as scheme_rows
    from posenc_cli.cli import app

    assert set(LEARNED) <= set(registry())
    rows = {r["name"]: r for r in scheme_rows()}
    for name in LEARNED:
        assert rows[name]["learned"] == LEARNED[name], name
        assert rows[name]["extrapolates"] == "yes"
        assert rows[name]["hooks"] == ("rotate" if name == "xpos" else "bias")
    out = CliRunner().invoke(app, ["schemes"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    for name in LEARNED:
        assert name in out.output and registry()[name].paper in out.output


@pytest.mark.parametrize(
    ("overrides", "field", "value"),
    [
        (["pos=t5", "pos.num_buckets=16"], "num_buckets", 16),
        (["pos=xpos", "pos.scale_base=256"], "scale_base", 256.0),
        (["pos=kerple", "pos.variant=power"], "variant", "power"),
        (["pos=fire", "pos.shared=true"], "shared", True),
        (["pos=sandwich", "pos.dim=64"], "dim", 64),
        (["pos=cope", "pos.max_pos=16"], "max_pos", 16),
    ],
)
def test_selectable_through_hydra(overrides: list[str], field: str, value: object) -> None:
    from posenc_cli.run.config_compose import compose_config

    cfg = compose_config(overrides)
    assert type(cfg.pos) is config_class(overrides[0].split("=")[1])
    assert getattr(cfg.pos, field) == value


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.mark.integration  # end to end
@pytest.mark.parametrize("name", sorted(registry()))
def test_trains_then_evaluates_at_four_times_training_length(name: str, corpus: Path, tmp_path: Path) -> None:
    from posenc_cli.evaluation.tasks.extrapolate import evaluate_run_dir
    from posenc_cli.run.load import load_run
    from posenc_cli.run.train import train

    cfg = tiny_config(
        corpus, pos=name, model={"n_layer": n_layer_for(name)}, steps=20, lr=1e-2, eval_every=20, save_every=20
    )
    run_dir = tmp_path / name
    train(cfg, run_dir)
    losses = [loss for (loss,) in metrics(run_dir, ("train_loss",))]
    assert len(losses) == 20
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses

    out = evaluate_run_dir(run_dir, EvalConfig(lengths=[1, 4], tokens=128), device="cpu", threads=1)
    by_multiple = {e["multiple"]: e for e in out["entries"]}
    assert by_multiple[4]["length"] == 64
    if not registry()[name].extrapolates:  # refused at 4×, reported as n/a
        assert by_multiple.pop(4)["status"] == "n/a"
    for entry in by_multiple.values():
        assert entry["status"] == "ok" and entry["ppl"] is not None and entry["ppl"] < 1e4, entry

    reloaded = load_run(run_dir).model.scheme  # the scheme's learned parameters are checkpointed
    assert set(reloaded.state_dict()) == {k for k, _ in make(name, n_layer=n_layer_for(name)).scheme.named_parameters()}
