"""`posenc compare` on per-layer layout runs: seeds of one preset share a row under its name; two layouts that
differ only in `pos.layers` never do (their saved configs differ), and the sweep identity tells them apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_utils import tiny_config, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.sweep.identity import identity_hash, job_identity

runner = CliRunner()
MIX_A = [{"name": "rope"}, {"name": "nope"}]
MIX_B = [{"name": "nope"}, {"name": "rope"}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """irope seeds 0 and 1 (4 layers) and two 2-layer layouts in mirrored order, 4 steps each, evaluated."""
    from posenc_cli.run.train import train

    root = tmp_path_factory.mktemp("compare-layouts")
    corpus = write_corpus(root)
    jobs = {
        "s0/irope": ("irope", {"n_layer": 4}, 0, None),
        "s1/irope": ("irope", {"n_layer": 4}, 1, None),
        "a/mix": ("layout", {}, 0, MIX_A),
        "b/mix": ("layout", {}, 0, MIX_B),
    }
    for rel, (pos, model, seed, layers) in jobs.items():
        cfg = tiny_config(corpus, pos=pos, model=model, steps=4, eval_every=4, save_every=4, seed=seed)
        if layers is not None:
            cfg.pos.layers = layers
            cfg.pos.resolve(cfg.model, cfg.train.seq_len)
        train(cfg, root / "all" / rel)
    result = runner.invoke(app, ["eval-extrapolate", str(root / "all"), "--lengths", "1", "--tokens", "32",
                                 "--no-longppl", "--device", "cpu"])  # fmt: skip
    assert result.exit_code == 0, result.output
    return root / "all"


def test_seeds_of_a_preset_share_its_row_and_layouts_stay_apart(runs: Path) -> None:
    result = runner.invoke(app, ["compare", str(runs), "--format", "json"], terminal_width=200)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    by_row: dict[str, set[str]] = {}
    for r in rows:
        by_row.setdefault(r["row"], set()).add(r["run_dir"])
    irope = [name for name, dirs in by_row.items() if len(dirs) == 2]
    assert irope == ["irope"]  # the preset's name, both seeds in one row
    mixes = sorted(name for name in by_row if "mix" in name)
    assert len(mixes) == 2 and all(len(by_row[m]) == 1 for m in mixes)  # one row per layout
    assert {r["scheme"] for r in rows} == {"irope", "layout"}


def test_sweep_identity_tells_layouts_apart_by_their_layers() -> None:
    def identity(layers: list[dict], n_layer: int = 2) -> str:
        cfg = tiny_config(Path("corpus.txt"), pos="layout", model={"n_layer": n_layer})
        cfg.pos.layers = layers
        cfg.pos.resolve(cfg.model, cfg.train.seq_len)
        return identity_hash(job_identity(cfg))

    assert identity(MIX_A) != identity(MIX_B)
    sliding = [{"name": "rope", "span": "sliding"}, {"name": "nope"}]
    assert identity(sliding) != identity(MIX_A)
    assert identity(sliding) == identity([{"name": "rope", "span": "sliding", "window": 4}, {"name": "nope"}])
    assert identity(sliding) != identity([{"name": "rope", "span": "sliding", "window": 5}, {"name": "nope"}])
