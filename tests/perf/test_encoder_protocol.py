"""benchmarks/encoder_protocol.py: the two layouts, the encoder's unmasked reach, refusals, and a 2-step run's rows."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def ep() -> ModuleType:
    return load_benchmark("encoder_protocol")


def test_the_encoder_batch_puts_the_targets_at_the_blanks_only(ep: ModuleType) -> None:
    inputs, outputs = torch.tensor([[3, 1, 4]]), torch.tensor([[1, 3, 4]])
    x, y = ep.encoder_batch(inputs, outputs)
    assert x.tolist() == [[3, 1, 4, ep.BLANK, ep.BLANK, ep.BLANK]]
    assert y.tolist() == [[ep.IGNORE] * 3 + [1, 3, 4]]  # scored exactly where the blanks are
    assert ep.BLANK not in [ep.SYMBOLS.index(s) for s in ep.SYMBOLS]  # the tape token is no symbol


def test_the_decoder_batch_feeds_the_outputs_after_the_separator(ep: ModuleType) -> None:
    x, y = ep.decoder_batch(torch.tensor([[3, 1, 4]]), torch.tensor([[1, 3, 4]]))
    assert x.tolist() == [[3, 1, 4, ep.SEP, 1, 3]]  # each output predicted from the one before it
    assert y.tolist() == [[ep.IGNORE] * 3 + [1, 3, 4]]  # the same targets at the same positions as the encoder's


def test_the_task_generator_gives_token_ids(ep: ModuleType) -> None:
    task = ep.check(ep.Options())
    inputs, outputs = ep.sample_batch(task, np.random.default_rng(0), 5, 4)
    assert inputs.shape == outputs.shape == (4, 5)
    assert torch.equal(outputs, inputs.sort(dim=1).values)  # bucket_sort: the inputs sorted


def test_only_the_encoder_sees_a_later_input_token(ep: ModuleType) -> None:
    options = ep.Options(max_length=4, steps=1)
    torch.manual_seed(0)
    model = ep.build_model(ep.model_config(options), ep.VOCAB).eval()
    base = torch.tensor([[0, 1, 2, ep.BLANK, ep.BLANK]])
    later = base.clone()
    later[0, 2] = 4  # a token after position 1
    for protocol, changes in (("encoder", True), ("decoder", False)):
        with torch.no_grad():
            a, b = ep.logits_of(model, protocol, base)[0, 1], ep.logits_of(model, protocol, later)[0, 1]
        assert (not torch.allclose(a, b)) is changes, protocol


def test_teacher_forced_and_generated_agree_on_one_output(ep: ModuleType) -> None:
    options = ep.Options(max_length=4, steps=1)
    torch.manual_seed(0)
    model = ep.build_model(ep.model_config(options), ep.VOCAB)
    inputs = torch.randint(0, 5, (16, 1), generator=torch.Generator().manual_seed(0))
    for outputs in (inputs.clone(), (inputs + 1) % 5):  # n = 1: nothing is fed back, so the two must agree
        generated = ep.score(ep.predict(model, "decoder", inputs, 1, "fp32"), outputs)["token_accuracy"]
        assert ep.teacher_forced(model, inputs, outputs, "fp32") == generated


def test_refuses_a_causal_only_scheme_and_a_variable_output_task(ep: ModuleType) -> None:
    with pytest.raises(ep.ConfigError, match="causal only"):
        ep.check(ep.Options(pos="alibi"))
    with pytest.raises(ep.ConfigError, match="output length"):
        ep.check(ep.Options(task="binary_addition"))
    assert ep.main(["--pos", "path", "--steps", "1"]) == 2


def test_a_two_step_run_gives_both_arms_rows_in_and_beyond(ep: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert (
        ep.main(["--max-length", "3", "--steps", "2", "--batch", "4", "--eval-examples", "2", "--out", str(out)]) == 0
    )
    result = json.loads(out.read_text())
    assert set(result["arms"]) == {"decoder", "encoder"}
    assert sorted(map(int, result["arms"]["encoder"]["per_length"])) == list(range(1, 7))
    table = ep.rows(result, 10)
    assert [label for label, _ in table] == ["1–3", "4–6", "**in 1–3**", "**beyond 4–6**"]
    assert all(len(values) == 5 and all(0.0 <= v <= 1.0 for v in values) for _, values in table)


def test_learned_positions_leave_the_rows_past_their_table_empty(ep: ModuleType) -> None:
    result = ep.run(ep.Options(pos="learned", max_length=2, steps=2, batch=2, eval_examples=2))
    per_length = result["arms"]["encoder"]["per_length"]
    assert per_length["2"] is not None and per_length["3"] is None  # 2 + 2 tokens fit the table of 4; 3 + 3 do not
    assert "n/a" in ep.markdown(result)
