"""Passkey episodes, the data=passkey source, exact-match scoring and the results file (no trained model needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scheme_utils import n_layer_for
from torch import nn

from posenc_cli.config import Config, ModelConfig, TokenizerConfig, TrainConfig
from posenc_cli.data.cache import load_corpus
from posenc_cli.data.sources import passkey as pk_source
from posenc_cli.data.sources.passkey import PasskeyDataConfig
from posenc_cli.data.tokenizer import ByteTokenizer, train_bpe
from posenc_cli.errors import LengthBeyondScheme
from posenc_cli.evaluation import passkey as pk
from posenc_cli.evaluation.tasks.passkey import evaluate_passkey_run
from posenc_cli.model import GPT
from posenc_cli.positional import config_class, registry
from posenc_cli.report import passkey_report
from posenc_cli.run.load import LoadedRun
from posenc_cli.run.meta import RunMeta

BYTES = ByteTokenizer()
# The landmark-attention prompt pieces, written out independently of the module's constants.
KEY_TEXT = " The pass key is {k}. Remember it. {k} is the pass key."
QUESTION_TEXT = " What is the pass key? The pass key is"
FILLER_TEXT = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


# ----------------------------------------------------------------------------------------------------------------
# Fake models (byte ids): they read the prompt, not our bookkeeping.


class CopyModel(nn.Module):
    """Predicts the next digit of the first key in its input (optionally only within the last `window` tokens).

    After k generated digits at the end of the input, the next token is the (k+1)-th digit of the first digit run;
    with no digit in view it predicts byte 0 (always wrong).
    """

    def __init__(self, window: int | None = None, max_length: int | None = None) -> None:
        super().__init__()
        self.window = window
        if max_length is not None:
            self.scheme = SimpleNamespace(name="learned", max_length=max_length)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        digit = (idx >= 48) & (idx <= 57)  # (B, T)
        trailing = torch.cumprod(digit.flip(1).long(), dim=1).sum(1)  # (B,) digits generated so far
        visible = digit.clone()
        if self.window is not None:
            visible[:, : max(0, T - self.window)] = False
        found = visible.any(1)  # (B,)
        first = visible.long().argmax(1)  # (B,) first visible digit
        nxt = idx.gather(1, (first + trailing).clamp(max=T - 1)[:, None])[:, 0]  # (B,)
        nxt = torch.where(found, nxt, torch.zeros_like(nxt))
        return nn.functional.one_hot(nxt, 257).float()[:, None, :].expand(B, T, 257)  # (B, T, V)


class RandomModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.g = torch.Generator().manual_seed(0)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.randn(*idx.shape, 257, generator=self.g)


# ----------------------------------------------------------------------------------------------------------------
# Episode text.


def test_episode_without_filler_is_the_landmark_prompt() -> None:
    prompt, answer = pk_source.episode_text("12345", 0, 0.5)
    assert prompt == KEY_TEXT.format(k="12345") + QUESTION_TEXT
    assert answer == " 12345"
    assert pk_source.fixed_chars(5) == len(prompt + answer) == 103


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.75, 1.0])
def test_key_sentence_sits_at_the_requested_depth(depth: float) -> None:
    n = 700
    prompt, answer = pk_source.episode_text("40821", n, depth)
    sentence = KEY_TEXT.format(k="40821")
    assert prompt.count(sentence) == 1 and prompt.endswith(QUESTION_TEXT) and answer == " 40821"
    start = prompt.index(sentence)
    assert abs(start / n - depth) <= 1 / n
    filler = prompt[:start] + prompt[start + len(sentence) : -len(QUESTION_TEXT)]
    assert len(filler) == n and filler == (FILLER_TEXT * 8)[:n]  # one continuous filler stream around the key


def test_episodes_are_deterministic_and_well_formed() -> None:
    kwargs = {"min_len": 0, "max_len": 300, "digits": 5}
    a = pk_source.make_episodes(200, seed=3, **kwargs)
    assert a == pk_source.make_episodes(200, seed=3, **kwargs)
    assert a != pk_source.make_episodes(200, seed=4, **kwargs)
    lengths = np.array([len(t) for t in a])
    assert lengths.min() >= 103 and lengths.max() <= 300 and lengths.std() > 30
    depths = []
    for text in a:
        m = re.fullmatch(
            r"(.*) The pass key is (\d{5})\. Remember it\. \2 is the pass key\.(.*)"
            + re.escape(QUESTION_TEXT)
            + r" (\d{5})",
            text,
        )
        assert m is not None and m.group(4) == m.group(2) and m.group(2)[0] != "0"
        n = len(m.group(1)) + len(m.group(3))
        if n > 50:
            depths.append(len(m.group(1)) / n)
    assert min(depths) < 0.1 and max(depths) > 0.9  # depths cover [0, 1]


# ----------------------------------------------------------------------------------------------------------------
# data=passkey


def test_passkey_source_through_load_corpus(tmp_path: Path) -> None:
    data = PasskeyDataConfig(passkey_episodes=50, val_fraction=0.1, cache_dir=str(tmp_path))
    corpus = load_corpus(data, TokenizerConfig())
    assert corpus.info["documents"] == {"train": 45, "val": 5}
    assert corpus.info["source"] == "passkey" and corpus.info["min_len"] == 103
    eod = corpus.tokenizer.eod_id
    train, val = np.asarray(corpus.train), np.asarray(corpus.val)
    docs = BYTES.decode(train).split("<|endoftext|>")[:-1]
    assert docs == pk_source.make_episodes(50, min_len=0, max_len=128, digits=5, seed=0)[5:]
    assert int((train == eod).sum()) == 45 and int((val == eod).sum()) == 5 and train[-1] == eod

    again = load_corpus(data, TokenizerConfig())
    assert again.info["reused"] and again.info["fingerprint"] == corpus.info["fingerprint"]
    other = load_corpus(PasskeyDataConfig(**{**data.__dict__, "passkey_seed": 1}), TokenizerConfig())
    assert other.info["fingerprint"] != corpus.info["fingerprint"]


def test_data_passkey_composes_from_the_config_group() -> None:
    from posenc_cli.errors import ConfigError
    from posenc_cli.run.config_compose import compose_config

    cfg = compose_config(["data=passkey", "data.passkey_episodes=10", "data.passkey_max_len=256"])
    assert cfg.data.source == "passkey" and cfg.data.passkey_episodes == 10 and cfg.data.passkey_max_len == 256
    with pytest.raises(ConfigError, match="passkey_max_len"):
        compose_config(["data=passkey", "data.passkey_min_len=300"])


# ----------------------------------------------------------------------------------------------------------------
# Prompts in token space.


@pytest.mark.parametrize("length", [104, 128, 300, 1000])
def test_byte_prompts_have_exact_length_and_match_the_training_text(length: int) -> None:
    keys = pk_source.random_keys(np.random.default_rng(0), 5, 5)
    depths = [0.0, 0.25, 0.5, 0.75, 1.0]
    batch = pk.build_prompts(BYTES, keys, depths, length)
    assert batch.prompts.shape == (5, length - 5) and (batch.answer_len == 5).all()
    assert (batch.prompts[:, 0] == BYTES.eod_id).all()  # a document start, as in training
    for i, (key, depth) in enumerate(zip(keys, depths, strict=True)):
        prompt, answer = pk_source.episode_text(key, int(batch.n_filler[i]), depth)
        assert BYTES.decode(batch.prompts[i][1:]) + BYTES.decode(batch.answers[i]) == prompt + answer
        assert BYTES.decode(batch.answers[i]) == key
        assert batch.key_start[i] == 1 + round(depth * batch.n_filler[i])
        assert BYTES.decode(batch.prompts[i][batch.key_start[i] :]).startswith(" The pass key is " + key)


def test_prompt_too_short_for_the_fixed_text() -> None:
    with pytest.raises(ValueError, match="shorter than a prompt without filler"):
        pk.build_prompts(BYTES, ["12345"], [0.5], 102)


def test_bpe_pieces_tokenize_like_the_joined_episode() -> None:
    """The pieces start with a space, so BPE of the whole episode equals the pieces' tokens joined."""
    bpe = train_bpe(pk_source.make_episodes(300, min_len=0, max_len=400, digits=5, seed=0), 400)
    n_cycle = len(bpe.encode(FILLER_TEXT))
    question = len(bpe.encode(QUESTION_TEXT))
    checked = 0
    for key in ["12345", "70707", "99999"]:
        answer = bpe.encode(" " + key)
        fixed = 1 + len(bpe.encode(KEY_TEXT.format(k=key))) + question + len(answer)  # 1: end-of-document
        for depth, before in ((0.0, 0), (0.5, 2), (1.0, 4)):  # 4 whole filler cycles, the key after `before`
            batch = pk.build_prompts(bpe, [key], [depth], fixed + 4 * n_cycle)
            assert batch.n_filler[0] == 4 * n_cycle and batch.key_start[0] == 1 + before * n_cycle
            text = FILLER_TEXT * before + KEY_TEXT.format(k=key) + FILLER_TEXT * (4 - before) + QUESTION_TEXT
            ids = np.concatenate([batch.prompts[0][1:], batch.answers[0][: batch.answer_len[0]]])
            assert ids.tolist() == bpe.encode(text + " " + key).tolist()
            assert bpe.decode(batch.answers[0][: batch.answer_len[0]]).strip() == key
            checked += 1
    assert checked == 9


# ----------------------------------------------------------------------------------------------------------------
# Scoring.


def test_exact_match_with_padded_answers() -> None:
    answers = np.array([[1, 2, 3], [4, 5, -1], [6, 7, -1]])
    generated = np.array([[1, 2, 3], [4, 5, 9], [6, 8, 0]])
    assert pk.exact_match(generated, answers, np.array([3, 2, 2])).tolist() == [True, True, False]
    assert pk.token_share(generated, answers, np.array([3, 2, 2])).tolist() == [1.0, 1.0, 0.5]


@pytest.mark.parametrize("length", [128, 512])
def test_copying_model_scores_one_and_random_model_zero(length: int) -> None:
    depths = [0.0, 0.5, 1.0]
    kwargs = {"length": length, "depths": depths, "trials": 6, "batch_tokens": 4 * length}
    cells = pk.evaluate_passkey_model(CopyModel(), BYTES, **kwargs)
    assert [c["accuracy"] for c in cells] == [1.0, 1.0, 1.0] and [c["depth"] for c in cells] == depths
    assert [c["token_accuracy"] for c in cells] == [1.0, 1.0, 1.0]
    assert all(s["output"] == s["key"] for c in cells for s in c["samples"])
    cells = pk.evaluate_passkey_model(RandomModel(), BYTES, **kwargs)
    assert [c["correct"] for c in cells] == [0, 0, 0]


def test_depth_matters_for_a_model_with_a_short_window() -> None:
    cells = pk.evaluate_passkey_model(CopyModel(window=100), BYTES, length=600, depths=[0.0, 1.0], trials=4)
    assert [c["accuracy"] for c in cells] == [0.0, 1.0]


def test_keys_are_seeded_per_cell() -> None:
    run = pk.evaluate_passkey_model(CopyModel(), BYTES, length=200, depths=[0.5, 1.0], trials=3, seed=7)
    alone = pk.evaluate_passkey_model(CopyModel(), BYTES, length=200, depths=[1.0], trials=3, seed=7)
    other = pk.evaluate_passkey_model(CopyModel(), BYTES, length=200, depths=[1.0], trials=3, seed=8)
    assert run[1]["samples"] == alone[0]["samples"] != other[0]["samples"]


def test_length_beyond_a_learned_table_is_refused_before_decoding() -> None:
    model = CopyModel(max_length=128)
    assert pk.evaluate_passkey_model(model, BYTES, length=129, depths=[1.0], trials=2)[0]["accuracy"] == 1.0
    with pytest.raises(LengthBeyondScheme):
        pk.evaluate_passkey_model(model, BYTES, length=130, depths=[1.0], trials=2)


# ----------------------------------------------------------------------------------------------------------------
# Results file.


def fake_run(path: Path, model: nn.Module, name: str = "nope") -> LoadedRun:
    from posenc_cli.positional import config_class

    cfg = Config(pos=config_class(name)(name=name), train=TrainConfig(seq_len=128))
    return LoadedRun(path=path, model=model, config=cfg, meta=RunMeta(step=0, train_length=128), tokenizer=BYTES)


def test_results_file_schema_reuse_and_na(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "copy", CopyModel(max_length=256), name="learned")
    cfg = pk.PasskeyConfig(lengths=[0.5, 1, 2, 4], depths=[0.0, 1.0], trials=3)
    out = evaluate_passkey_run(run, cfg, device="cpu")
    doc = json.loads((tmp_path / "copy" / "eval" / "passkey.json").read_text())
    assert {k: doc[k] for k in ("schema_version", "run", "scheme", "train_length", "base_length")} == {
        "schema_version": 1,
        "run": "copy",
        "scheme": "learned",
        "train_length": 128,
        "base_length": 128,
    }
    fields = {"accuracy", "trials", "correct", "length", "depth", "multiple", "status", "reason", "created"}
    assert all(fields | {"posenc_version", "digits", "seed", "dtype"} <= set(e) for e in doc["entries"])
    cells = [(e["length"], e["depth"], e["status"], e["accuracy"]) for e in doc["entries"]]
    assert cells == [
        (64, 0.0, "n/a", None),
        (64, 1.0, "n/a", None),
        (128, 0.0, "ok", 1.0),
        (128, 1.0, "ok", 1.0),
        (256, 0.0, "ok", 1.0),
        (256, 1.0, "ok", 1.0),
        (512, 0.0, "n/a", None),
        (512, 1.0, "n/a", None),
    ]
    reasons = {e["length"]: e["reason"] for e in doc["entries"]}
    assert "shorter than a prompt without filler" in reasons[64]
    assert reasons[512] == "scheme 'learned' supports at most 256 positions"
    assert [e["multiple"] for e in out["entries"]][::2] == [0.5, 1.0, 2.0, 4.0] and out["reused"] == 0

    again = evaluate_passkey_run(run, cfg, device="cpu")
    assert again["reused"] == 8 and again["entries"] == out["entries"]
    forced = evaluate_passkey_run(run, cfg, device="cpu", force=True)
    assert forced["reused"] == 0 and len(json.loads(pk.results_path(run.path).read_text())["entries"]) == 8

    more = evaluate_passkey_run(run, pk.PasskeyConfig(lengths=[1], depths=[0.5], trials=3), device="cpu")
    assert more["reused"] == 0 and len(json.loads(pk.results_path(run.path).read_text())["entries"]) == 9


def test_table_and_figure_render(tmp_path: Path) -> None:
    from rich.console import Console

    from posenc_cli.report.plots import save_figure

    results = [
        evaluate_passkey_run(fake_run(tmp_path / n, m), pk.PasskeyConfig(lengths=[1, 2], trials=2), device="cpu")
        for n, m in (("copy", CopyModel()), ("rand", RandomModel()))
    ]
    console = Console(record=True, width=160)
    console.print(passkey_report.passkey_table(results))
    text = console.export_text()
    assert "length \\ depth" in text and "25%" in text and "100%" in text and "0%" in text and "2× · 256" in text
    path = save_figure(passkey_report.passkey_figure(results), tmp_path / "heat.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _Uncached(nn.Module):
    """The same model without `new_cache`: greedy_decode then runs a full forward per generated token."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(idx, position_ids=position_ids)


@pytest.mark.parametrize("scheme", sorted(registry()))
def test_cached_greedy_decoding_generates_what_full_forwards_generate(scheme: str) -> None:
    torch.manual_seed(3)
    model_cfg = ModelConfig(d_model=32, n_layer=n_layer_for(scheme), n_head=2, init_std=0.3)
    model = GPT(model_cfg, config_class(scheme)(), 40, 32).eval()
    prompts = torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cached = pk.greedy_decode(model, prompts, 10)
        full = pk.greedy_decode(_Uncached(model), prompts, 10)
    assert cached.shape == (3, 10)
    assert torch.equal(cached, full)


@pytest.mark.parametrize("scheme", ["rope", "learned", "alibi"])
def test_cached_greedy_decoding_with_random_ids_matches_full_forwards(scheme: str) -> None:
    """A randomized-position run decodes at its draws: the cache carries the prompt's ids and each new token's."""
    from posenc_cli.evaluation.positions import Positions

    torch.manual_seed(3)
    pos = config_class(scheme)(table_size=64) if scheme == "learned" else config_class(scheme)()
    model = GPT(ModelConfig(d_model=32, n_layer=2, n_head=2, init_std=0.3), pos, 40, 32).eval()
    prompts = torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(4))
    positions = Positions("random", 64, 0)
    ids = positions.draw(3, 12 + 8, positions.generator(20))  # (3, 20)
    with torch.no_grad():
        cached = pk.greedy_decode(model, prompts, 8, position_ids=ids)
        full = pk.greedy_decode(_Uncached(model), prompts, 8, position_ids=ids)
        plain = pk.greedy_decode(model, prompts, 8)
    assert torch.equal(cached, full)
    assert not torch.equal(cached, plain)  # the ids reach the model


class _Counted(nn.Module):
    """Wraps a model and counts its forwards (cached or not, as the wrapped model offers)."""

    def __init__(self, model: nn.Module, cached: bool) -> None:
        super().__init__()
        self.model, self.calls = model, 0
        if cached:
            self.new_cache = model.new_cache

    def forward(self, idx: torch.Tensor, **kwargs: object) -> torch.Tensor:
        self.calls += 1
        return self.model(idx, **kwargs)


@pytest.mark.parametrize("cached", [True, False])
def test_decoding_stops_once_every_row_has_its_stop_token(cached: bool) -> None:
    """With `stop_id`, each row's tokens up to its first stop are those of the full decode, the rest hold the stop
    token, and fewer forwards run; without one, every step runs. Six ids, so tokens recur."""
    torch.manual_seed(3)
    model = GPT(
        ModelConfig(d_model=32, n_layer=2, n_head=2, init_std=0.3), config_class("rope")(), 6, 32
    ).eval()  # 6 ids
    prompts = torch.randint(0, 6, (3, 12), generator=torch.Generator().manual_seed(4))
    steps = 16
    with torch.no_grad():
        full = pk.greedy_decode(model, prompts, steps)  # (3, 16)
        firsts = [row.tolist() for row in full]
        # the stop token: the one whose latest first appearance over the rows comes earliest
        candidates = {t for row in firsts for t in row if all(t in r for r in firsts)}
        assert candidates, "the seeded model repeats no token in every row: pick another seed"
        stop = min(candidates, key=lambda t: max(r.index(t) for r in firsts))
        last = max(r.index(stop) for r in firsts)
        assert last < steps - 1
        counted = _Counted(model, cached)
        stopped = pk.greedy_decode(counted, prompts, steps, stop_id=stop)
    assert stopped.shape == full.shape
    for row, ref in zip(stopped.tolist(), firsts, strict=True):
        k = ref.index(stop)
        assert row[: k + 1] == ref[: k + 1] and set(row[k + 1 :]) <= {stop}
    assert counted.calls == last + 1  # the prompt's forward yields step 0; one more per step up to the last stop
