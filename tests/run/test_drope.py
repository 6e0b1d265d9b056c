"""DroPE's switch (train.drope_at): positions dropped after update k, recorded in the run, rebuilt on load, and
exact resume across the switch."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import safetensors.torch
import torch
from scheme_utils import lively, n_layer_for
from train_utils import metrics, same_weights, tiny_config, tiny_overrides, weights, write_corpus
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.config import ModelConfig, PosConfig
from posenc_cli.errors import CheckpointError, ConfigError
from posenc_cli.model import GPT, build_model
from posenc_cli.positional import config_class, registry
from posenc_cli.positional.layout import LayoutConfig
from posenc_cli.run.drope import check_drope, refuse_dropped
from posenc_cli.run.journal import committed_file
from posenc_cli.run.layout import META_FILE, MODEL_FILE, STATE_FILE
from posenc_cli.run.load import load_run, model_like
from posenc_cli.run.meta import read_meta
from posenc_cli.run.train import train

runner = CliRunner()
K = 12  # drope_at: not a save_every multiple, so a resume has to replay the switch
STEPS = dict(steps=20, save_every=5, grad_accum=2, drope_at=K)
MODEL = {"dropout": 0.1}  # dropout and accumulation make the comparison sensitive to every RNG stream
TINY = ModelConfig(d_model=32, n_layer=4, n_head=2)
VOCAB = 40


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def references(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Uninterrupted runs that drop at step K, per scheme (rope: no scheme parameters; learned: a table)."""
    root = tmp_path_factory.mktemp("refs")
    runs = {}
    for pos in ("rope", "learned"):
        train(tiny_config(corpus, pos=pos, model=MODEL, **STEPS), root / pos)
        runs[pos] = root / pos
    return runs


def _signal_at(step: int):
    def callback(event: dict) -> None:
        if event["event"] == "step" and event["step"] == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return callback


def _file(run: Path, name: str) -> bytes:
    return committed_file(run, name).read_bytes()


def _logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(idx)


# -- the model ---------------------------------------------------------------------------------------------------


ROPE_THEN_NOPE = LayoutConfig(layers=[{"name": "rope"}, {"name": "nope"}])


@pytest.mark.parametrize("pos", [config_class("rope")(), config_class("learned")(), ROPE_THEN_NOPE])
def test_dropping_leaves_the_forward_without_positions(pos) -> None:
    """The dropped model is the position-free forward of the same weights; the scheme's parameters are gone."""
    torch.manual_seed(0)
    model = GPT(TINY, pos, VOCAB, 16)
    idx = torch.randint(0, VOCAB, (2, 12))
    before = _logits(model, idx)
    model.drop_positions()
    model.drop_positions()  # idempotent
    assert model.positions_dropped and not any(k.startswith("scheme.") for k in model.state_dict())
    plain = GPT(TINY, config_class("nope")(), VOCAB, 16)
    plain.load_state_dict(model.state_dict(), strict=True)
    after = _logits(model, idx)
    assert torch.equal(after, _logits(plain, idx)) and not torch.allclose(after, before)
    assert torch.isfinite(_logits(model, torch.randint(0, VOCAB, (1, 40)))).all()  # no position limit (learned: 16)


def nope_like(model: GPT) -> LayoutConfig | PosConfig:
    """NoPE in every layer with the spans and temperatures the dropped `model` kept (plain NoPE if none)."""
    kept = model.scheme.layers or ()
    if all(span.is_full and t is None for span, t in kept):
        return config_class("nope")()
    layers = [
        {"name": "nope", "span": span.kind, "window": span.size or None, "temperature": t.scale if t else 0.0,
         "floor_scale": t.floor if t else None}
        for span, t in kept
    ]  # fmt: skip
    return LayoutConfig(layers=layers)


@pytest.mark.parametrize("name", sorted(set(registry()) - {"nope"}))
def test_every_scheme_drops_to_the_forward_without_positions(name: str) -> None:
    """Registry contract: whatever a scheme hooks into (embeddings, q/k, biases, content, logits, normaliser), the
    dropped model computes what a NoPE model with the same remaining weights and the same layer spans and
    temperatures computes (a layout keeps its windows, chunks and floor-log temperatures, as DroPE's reference keeps
    Qwen2's sliding window)."""
    torch.manual_seed(0)
    mc = ModelConfig(d_model=32, n_layer=n_layer_for(name, 4), n_head=2)
    model = lively(GPT(mc, config_class(name)(), VOCAB, 16))
    idx = torch.randint(0, VOCAB, (2, 12))
    before = _logits(model, idx)
    model.drop_positions()
    plain = GPT(mc, nope_like(model), VOCAB, 16)
    plain.load_state_dict(model.state_dict(), strict=True)
    after = _logits(model, idx)
    torch.testing.assert_close(after, _logits(plain, idx), rtol=0, atol=1e-6)
    assert not torch.allclose(after, before)


WINDOWED = LayoutConfig(layers=[{"name": "rope", "span": "sliding", "window": 4}, {"name": "rope"}])


def test_a_window_is_kept_and_only_the_encoding_dropped() -> None:
    """DroPE on a layout drops the rotation and keeps the sliding window (the reference keeps Qwen2's
    sliding_window); `keep_layout=False`, what runs dropped before did, widens every layer to full attention."""
    torch.manual_seed(0)
    windowed = GPT(TINY, WINDOWED, VOCAB, 16)
    idx = torch.randint(0, VOCAB, (1, 10))
    windowed.drop_positions()
    assert windowed.keeps_layout
    nope_windowed = GPT(TINY, nope_like(windowed), VOCAB, 16)
    nope_windowed.load_state_dict(windowed.state_dict())
    plain = GPT(TINY, config_class("nope")(), VOCAB, 16)
    plain.load_state_dict(windowed.state_dict())
    kept = _logits(windowed, idx)
    assert isinstance(nope_like(windowed), LayoutConfig)
    torch.testing.assert_close(kept, _logits(nope_windowed, idx), rtol=0, atol=1e-6)
    assert not torch.allclose(kept, _logits(plain, idx))  # the window changes what the later tokens see
    legacy = GPT(TINY, WINDOWED, VOCAB, 16)
    legacy.load_state_dict(windowed.state_dict(), strict=False)
    legacy.drop_positions(keep_layout=False)
    assert not legacy.keeps_layout and torch.equal(_logits(legacy, idx), _logits(plain, idx))


def test_a_run_dropped_before_the_layout_was_kept_loads_as_it_was_trained(corpus: Path, tmp_path: Path) -> None:
    """meta.json without `positions_dropped_kept_layout`: the run dropped its windows too, and loads so."""
    cfg = tiny_config(corpus, pos="rope", steps=4, drope_at=2)
    cfg = type(cfg)(model=cfg.model, pos=WINDOWED, data=cfg.data, train=cfg.train)
    train(cfg, tmp_path / "run")
    meta = read_meta(tmp_path / "run")
    assert meta["positions_dropped_kept_layout"] is True and load_run(tmp_path / "run").model.keeps_layout
    meta_path = committed_file(tmp_path / "run", META_FILE)
    del meta["positions_dropped_kept_layout"]
    meta_path.write_text(json.dumps(meta))
    loaded = load_run(tmp_path / "run")
    assert loaded.positions_dropped_at == 2 and not loaded.model.keeps_layout
    assert not model_like(loaded).keeps_layout


def test_a_dropped_model_decodes_with_the_kv_cache() -> None:
    torch.manual_seed(0)
    model = GPT(TINY, config_class("learned")(), VOCAB, 16).eval()
    model.drop_positions()
    idx = torch.randint(0, VOCAB, (2, 24))  # past the 16-row table the dropped model no longer has
    cache = model.new_cache()
    with torch.no_grad():
        parts = [model(idx[:, :10], cache=cache), *(model(idx[:, t : t + 1], cache=cache) for t in range(10, 24))]
    torch.testing.assert_close(torch.cat(parts, dim=1), _logits(model, idx), rtol=1e-5, atol=1e-5)


# -- the config --------------------------------------------------------------------------------------------------


def test_settings_that_cannot_drop_anything_are_refused(corpus: Path, tmp_path: Path) -> None:
    check_drope(tiny_config(corpus, pos="rope", steps=8, drope_at=8))  # no recalibration: allowed, the control
    check_drope(tiny_config(corpus, pos="nope", steps=8))  # off
    windowed = LayoutConfig(layers=[{"name": "nope", "span": "sliding", "window": 4}])
    cfg = tiny_config(corpus, pos="rope", steps=8, drope_at=4)
    with pytest.raises(ConfigError, match=r"pos=layout has no positional signal"):  # a window is kept, not dropped
        check_drope(type(cfg)(model=cfg.model, pos=windowed, data=cfg.data, train=cfg.train))
    with pytest.raises(ConfigError, match=r"train.drope_at=9 is past train.steps=8"):
        check_drope(tiny_config(corpus, pos="rope", steps=8, drope_at=9))
    with pytest.raises(ConfigError, match=r"pos=nope has no positional signal to drop"):
        check_drope(tiny_config(corpus, pos="nope", steps=8, drope_at=4))
    plain_layout = LayoutConfig(layers=[{"name": "nope"}])
    with pytest.raises(ConfigError, match=r"pos=layout has no positional signal"):
        check_drope(type(cfg)(model=cfg.model, pos=plain_layout, data=cfg.data, train=cfg.train))
    with pytest.raises(ConfigError, match="past train.steps"):
        train(tiny_config(corpus, pos="rope", steps=8, drope_at=9), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written


# -- training ----------------------------------------------------------------------------------------------------


def test_the_switch_is_recorded_and_changes_only_what_follows(corpus: Path, references: dict[str, Path], tmp_path):
    events: list[dict] = []
    plain = train(tiny_config(corpus, pos="learned", model=MODEL, **{**STEPS, "drope_at": 0}), tmp_path / "plain")
    dropped = references["learned"]
    meta = read_meta(dropped)
    assert meta["positions_dropped_at"] == K and "positions_dropped_at" in meta["extra_keys"]
    assert meta["n_params"] == read_meta(tmp_path / "plain")["n_params"] - 16 * 32  # the 16 x 32 table is gone
    state = safetensors.torch.load(_file(dropped, STATE_FILE))
    steps = [state[k] for k in state if k.startswith("optim.") and k.endswith(".step")]
    assert steps and all(int(s) == 20 for s in steps)  # AdamW's moments carried over the switch, not restarted
    assert plain.positions_dropped_at is None and read_meta(tmp_path / "plain").get("positions_dropped_at") is None
    a, b = metrics(tmp_path / "plain"), metrics(dropped)
    assert a[:K] == b[:K] and a[K][2] != b[K][2]  # steps 1..K trained with positions; step K+1 without
    again = train(tiny_config(corpus, pos="learned", model=MODEL, **STEPS), tmp_path / "d", callback=events.append)
    assert [e["step"] for e in events if e["event"] == "drope"] == [K] and again.positions_dropped_at == K
    assert train(tiny_config(corpus, pos="learned", model=MODEL, **STEPS), dropped).positions_dropped_at == K


@pytest.mark.parametrize(("pos", "stop"), [("rope", 7), ("rope", 16), ("learned", 7), ("learned", K), ("learned", 16)])
def test_resume_across_the_switch_is_bitwise_identical(
    corpus: Path, references: dict[str, Path], tmp_path: Path, pos: str, stop: int
) -> None:
    """Stopped before, at or after update K: weights, optimizer state and metrics end as the uninterrupted run's."""
    cfg = tiny_config(corpus, pos=pos, model=MODEL, **STEPS)
    run = tmp_path / "run"
    stopped = train(cfg, run, callback=_signal_at(stop))
    assert stopped.stopped_reason == "interrupted" and stopped.step == stop
    assert load_run(run, complete_only=False).model.positions_dropped == (stop >= K)
    assert stopped.positions_dropped_at == (K if stop >= K else None)
    done = train(cfg, run, resume=True)
    ref = references[pos]
    assert done.step == 20 and done.positions_dropped_at == K
    assert _file(run, MODEL_FILE) == _file(ref, MODEL_FILE) and same_weights(weights(run), weights(ref))
    ours, theirs = safetensors.torch.load(_file(run, STATE_FILE)), safetensors.torch.load(_file(ref, STATE_FILE))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    state, ref_state = json.loads(_file(run, "state.json")), json.loads(_file(ref, "state.json"))
    assert state["optimizer"] == ref_state["optimizer"]
    assert metrics(run) == metrics(ref)


@pytest.mark.integration  # compile
def test_a_compiled_run_compiles_the_dropped_model_again(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Dynamo's eager backend (graph capture, eager kernels): the compiled steps after the switch are the
    eager run's, so the compiled forward is the dropped model's."""
    import posenc_cli.run.compile as compiling

    modes: list[str] = []
    real = torch.compile

    def spy(model, **kwargs):
        modes.append(kwargs["mode"])
        return real(model, **kwargs)

    monkeypatch.setattr(compiling, "BACKEND", "eager")
    monkeypatch.setattr(torch, "compile", spy)
    common = dict(pos="learned", steps=6, save_every=6, drope_at=3)
    train(tiny_config(corpus, **common), tmp_path / "eager")
    train(tiny_config(corpus, compile=True, **common), tmp_path / "compiled")
    assert modes == ["default", "default"]  # once at the start, once at the switch
    assert metrics(tmp_path / "compiled") == metrics(tmp_path / "eager")


def test_a_trained_run_continued_with_more_steps_drops_where_it_resumes(corpus: Path, tmp_path: Path) -> None:
    """Recalibrating a finished run (the authors' use): --force-config with more steps and drope_at = its step."""
    run = tmp_path / "run"
    train(tiny_config(corpus, pos="rope", steps=6, save_every=3), run)
    with pytest.raises(ConfigError, match="train.drope_at: 0 -> 6"):  # config_diff: a changed drope_at needs it
        train(tiny_config(corpus, pos="rope", steps=6, save_every=3, drope_at=6), run)
    done = train(tiny_config(corpus, pos="rope", steps=9, save_every=3, drope_at=6), run, force_config=True)
    assert done.positions_dropped_at == 6 and load_run(run).model.positions_dropped


def test_a_child_of_a_dropped_run_has_no_positions(corpus: Path, references: dict[str, Path], tmp_path: Path) -> None:
    child = tmp_path / "child"
    done = train(tiny_config(corpus, pos="learned", steps=2, save_every=2), child, init_from=references["learned"])
    assert done.positions_dropped_at == 0 and read_meta(child)["positions_dropped_at"] == 0
    assert load_run(child).model.positions_dropped


# -- loading -----------------------------------------------------------------------------------------------------


def test_a_dropped_run_loads_as_the_forward_without_positions(references: dict[str, Path]) -> None:
    loaded = load_run(references["rope"])
    assert loaded.positions_dropped_at == K and loaded.scheme_label == f"rope, dropped at {K}"
    idx = torch.randint(0, loaded.tokenizer.vocab_size, (2, 24))
    got = _logits(loaded.model, idx)
    cfg = loaded.config
    plain = GPT(cfg.model, config_class("nope")(), loaded.tokenizer.vocab_size, cfg.train.seq_len)
    plain.load_state_dict(loaded.model.state_dict(), strict=True)
    rotated = build_model(cfg, loaded.tokenizer.vocab_size)
    rotated.load_state_dict(loaded.model.state_dict(), strict=True)
    assert torch.equal(got, _logits(plain, idx)) and not torch.allclose(got, _logits(rotated, idx))


def test_a_rebuilt_model_of_a_dropped_run_stays_dropped(references: dict[str, Path]) -> None:
    """model_like: what a command that rebuilds a loaded run's model under changed settings builds."""
    loaded = load_run(references["learned"])
    rebuilt = model_like(loaded)
    rebuilt.load_state_dict(loaded.model.state_dict(), strict=True)  # no position table to miss
    idx = torch.randint(0, loaded.tokenizer.vocab_size, (1, 40))  # past the table the run had
    assert torch.equal(_logits(rebuilt, idx), _logits(loaded.model, idx))


def test_a_dropped_run_is_not_exported(references: dict[str, Path], tmp_path: Path) -> None:
    """Every architecture export writes encodes positions: writing one would put the scheme back."""
    from posenc_cli.errors import NotExportable
    from posenc_cli.run.export import export_run

    with pytest.raises(NotExportable, match=f"dropped its positions after step {K}"):
        export_run(references["rope"], tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_commands_that_need_the_scheme_can_refuse_a_dropped_run(references: dict[str, Path]) -> None:
    refuse_dropped(references["rope"], None, "there is no RoPE to scale")  # kept its positions: nothing to refuse
    k = load_run(references["rope"]).positions_dropped_at
    with pytest.raises(ConfigError, match=rf"dropped its positions after step {K} \(train.drope_at\): there is no"):
        refuse_dropped(references["rope"], k, "there is no RoPE to scale")


@pytest.mark.parametrize("value", ["absent", -1, 99, "12"])
def test_a_meta_json_that_misstates_the_switch_is_refused(references: dict[str, Path], tmp_path: Path, value) -> None:
    import shutil

    run = Path(shutil.copytree(references["rope"], tmp_path / "run"))
    path = committed_file(run, META_FILE)
    meta = json.loads(path.read_text())
    if value == "absent":
        del meta["positions_dropped_at"]
    else:
        meta["positions_dropped_at"] = value
    path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="positions_dropped_at|kept its positions"):
        load_run(run)


# -- the CLI -----------------------------------------------------------------------------------------------------


def _overrides(corpus: Path, pos: str, **train_keys) -> list[str]:
    return [f"pos={pos}" if o.startswith("pos=") else o for o in tiny_overrides(corpus, **train_keys)]


def test_posenc_train_drops_and_says_so(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", *_overrides(corpus, "rope", steps=6, save_every=3, eval_every=3, drope_at=3), "--out", str(out)]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "step 3: positions dropped" in result.output and "dropped after step 3 (DroPE)" in result.output
    assert read_meta(out)["positions_dropped_at"] == 3
    bad = ["train", *_overrides(corpus, "rope", steps=6, drope_at=7), "--out", str(tmp_path / "bad")]
    refused = runner.invoke(app, bad, terminal_width=200)
    assert refused.exit_code == 2 and "train.drope_at=7 is past train.steps=6" in refused.output
    assert "Traceback" not in refused.output and not (tmp_path / "bad").exists()


def test_eval_extrapolate_measures_the_dropped_model(references: dict[str, Path], tmp_path: Path) -> None:
    """The learned table holds 16 positions: only a model without it can be measured at 2x."""
    out = tmp_path / "ppl.json"
    args = ["eval-extrapolate", str(references["learned"]), "--protocol", "nonoverlap", "--lengths", "1,2"]
    result = runner.invoke(app, [*args, "--tokens", "64", "--no-longppl", "--device", "cpu", "--json", str(out)])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(out.read_text())["runs"]
    assert [(e["length"], e["status"]) for e in run["entries"]] == [(16, "ok"), (32, "ok")]
