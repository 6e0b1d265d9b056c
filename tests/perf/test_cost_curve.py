"""The cost curve (`posenc bench --eval-lengths`): predictions that skip a case, the four states of a cell, the
watchdog's memory and time limits on a real subprocess, the longest length within the limit, the JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict

import pytest

from posenc_cli.config import ModelConfig
from posenc_cli.errors import ConfigError
from posenc_cli.perf import cost_curve as cc

TINY = ModelConfig(d_model=32, n_layer=1, n_head=2)


def tiny_cfg(*extra: str):
    from posenc_cli.run.config_compose import compose_config

    overrides = ["model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=16"]
    return compose_config([*overrides, "train.threads=1", "train.device=cpu", "train.precision=fp32", *extra], None)


def case(length: int = 32, **fields) -> cc.CurveCase:
    base = dict(model=asdict(TINY), scheme="nope", vocab_size=257, train_length=16, length=length)
    return cc.CurveCase(**{**base, "precision": "fp32", "device": "cpu", "threads": 1, **fields})


def measured(length: int, seconds: float, increase: float, base: float = 250.0, wall: float = 2.0) -> dict:
    return dict(
        scheme="t5", length=length, status=cc.MEASURED, seconds=seconds, repeats=1, wall_s=wall,
        peak_mib=base + increase, base_mib=base, increase_mib=increase,
    )  # fmt: skip


def test_predict_follows_the_local_power_law_within_its_clamp() -> None:
    assert cc.predict([(1024, 1.0)], 2048, 1.0, 2.0) is None  # one point: no law
    assert cc.predict([(1024, 1.0), (2048, 4.0)], 4096, 1.0, 2.0) == pytest.approx(16.0)  # quadratic
    assert cc.predict([(1024, 1.0), (2048, 8.0)], 4096, 1.0, 2.0) == pytest.approx(32.0)  # cubic clamped to 2
    assert cc.predict([(1024, 2.0), (2048, 2.0)], 4096, 1.0, 2.0) == pytest.approx(4.0)  # flat raised to linear
    assert cc.predict([(1024, 0.0), (2048, 2.0)], 4096, 0.0, 2.0) is None


def test_skip_reason_for_memory_and_time_predictions() -> None:
    opts = cc.CurveOptions(lengths=(1024, 2048, 4096), time_budget_s=100.0)
    done = [measured(1024, 1.0, 100.0), measured(2048, 4.0, 400.0, wall=5.0)]
    gib = 2**30
    assert cc.skip_reason(done, 4096, opts, 24 * gib, spent_s=7.0) is None  # 16 s predicted, 93 s left
    over = cc.skip_reason(done, 4096, opts, 1 * gib, spent_s=7.0)  # 250 + 1600 MiB predicted > 1 GiB
    assert over and over.startswith("over the memory limit (1.0 GiB): predicted 1.8 GiB")
    late = cc.skip_reason(done, 4096, opts, 24 * gib, spent_s=90.0)  # 1 s start + 16 s forward > 10 s left
    assert late == "time budget (100 s per scheme): predicted 17 s, 10 s left"
    assert cc.skip_reason(done[:1], 2048, opts, 24 * gib, spent_s=100.0) == "time budget (100 s per scheme) spent"
    unlimited = cc.CurveOptions(lengths=(1024,), time_budget_s=None)
    assert cc.skip_reason(done, 4096, unlimited, 24 * gib, spent_s=1e6) is None


def test_a_stopped_scheme_is_not_measured_further_and_cannot_stays_cannot() -> None:
    opts = cc.CurveOptions(lengths=(16, 32, 64))
    stopped = [{"scheme": "t5", "length": 32, "status": cc.NOT_MEASURED, "reason": "time budget spent"}]
    row = cc.next_row(case(64), stopped, opts, 2**30, lambda m: None)
    assert row["status"] == cc.NOT_MEASURED and row["reason"] == "stopped: not measured at 32 tokens"
    over = [measured(32, 0.1, 10.0) | {"over_limit": True}]
    assert cc.next_row(case(64), over, opts, 2**30, print)["reason"] == "stopped: over the memory limit at 32 tokens"
    cannot = [{"scheme": "learned", "length": 32, "status": cc.CANNOT, "reason": "at most 16 positions"}]
    assert cc.next_row(case(64), cannot, opts, 2**30, print) == {
        "scheme": "nope", "length": 64, "status": cc.CANNOT, "reason": "at most 16 positions"
    }  # fmt: skip


def test_reach_is_the_longest_length_measured_within_the_limit() -> None:
    rows = [measured(1024, 1, 10), measured(2048, 2, 20), measured(4096, 4, 5000)]
    rows += [{"scheme": "t5", "length": 8192, "status": cc.NOT_MEASURED, "reason": "stopped"}]
    rows += [{**measured(1024, 1, 1), "scheme": "nope"}]
    rows += [{"scheme": "learned", "length": 1024, "status": cc.CANNOT, "reason": "at most 128 positions"}]
    reach = cc.reach(rows, limit_mib=1000)
    assert reach["t5"]["longest"] == 2048 and reach["t5"]["beyond"] == 4096  # 5250 MiB measured: over the limit
    assert reach["t5"]["stopped_by"] == "measured 5,250 MiB, over the limit" and reach["t5"]["stop"] == "memory"
    assert reach["nope"] == {"longest": 1024, "peak_mib": 251, "beyond": None, "stopped_by": None, "stop": None}
    assert reach["learned"]["longest"] is None and reach["learned"]["stopped_by"].startswith("cannot measure")
    assert reach["learned"]["stop"] == "cannot"
    timed_out = [measured(1024, 1, 10), {"scheme": "t5", "length": 2048, "status": cc.NOT_MEASURED, "reason": "time"}]
    assert cc.reach(timed_out, limit_mib=1000)["t5"]["stop"] == "time"  # a lower bound: it reaches at least 1024


def test_options_refuse_bad_lengths_limits_and_schemes() -> None:
    for opts, words in [
        (cc.CurveOptions(lengths=()), "at least one"),
        (cc.CurveOptions(lengths=(0, 64)), ">= 1"),
        (cc.CurveOptions(lengths=(64, 64)), "twice"),
        (cc.CurveOptions(lengths=(64,), memory_limit_gib=0), "--memory-limit"),
        (cc.CurveOptions(lengths=(64,), time_budget_s=-1), "--time-budget"),
        (cc.CurveOptions(lengths=(64,), schemes=("rope", "nosuch")), "nosuch"),
    ]:
        with pytest.raises(ConfigError, match=words):
            opts.validate()


@pytest.mark.integration  # a measuring process killed
def test_watchdog_stops_a_case_over_the_memory_limit() -> None:
    out = cc.spawn_case(case(), timeout_s=None, memory_limit_bytes=8 * 2**20)  # python + torch pass 8 MiB at once
    assert out["status"] == cc.NOT_MEASURED and out["reason"].startswith("over the memory limit (0.0 GiB): stopped")


@pytest.mark.integration  # a measuring process killed
def test_watchdog_stops_a_case_past_its_time() -> None:
    out = cc.spawn_case(case(), timeout_s=0.2, memory_limit_bytes=2**40)  # importing torch alone takes longer
    assert out["status"] == cc.NOT_MEASURED and out["reason"].startswith("time budget spent: stopped after")


@pytest.mark.integration  # a measuring process killed
def test_a_crashing_case_is_failed_not_not_measured() -> None:
    out = cc.spawn_case(case(scheme="nosuch"), timeout_s=None, memory_limit_bytes=2**40)
    assert out["status"] == cc.FAILED and "unknown positional scheme pos=nosuch" in out["reason"]


@pytest.mark.integration  # end to end
def test_curve_measures_in_its_own_process_and_writes_json_and_csv() -> None:
    opts = cc.CurveOptions(lengths=(32, 16), schemes=("learned",), min_seconds=0.0, max_repeats=1)
    result = json.loads(json.dumps(cc.run_curve(tiny_cfg(), opts)))  # JSON-ready
    assert result["lengths"] == [16, 32] and result["precision"] == "fp32" and result["threads"] == 1
    assert result["memory_limit_applied_gib"] <= 24 and result["time_budget_s"] == 300
    first, second = result["rows"]
    assert first["status"] == cc.MEASURED and first["length"] == 16 and first["repeats"] == 1
    assert first["us_per_token"] == pytest.approx(first["seconds"] / 16 * 1e6)
    assert first["peak_mib"] >= first["base_mib"] > 50  # a whole process with torch loaded, not a tensor count
    assert first["increase_mib"] == pytest.approx(first["peak_mib"] - first["base_mib"])
    assert second == {  # the learned table holds train.seq_len = 16 positions
        "scheme": "learned", "length": 32, "status": cc.CANNOT,
        "reason": "scheme 'learned' supports at most 16 positions", "wall_s": second["wall_s"],
    }  # fmt: skip
    assert result["reach"]["learned"]["longest"] == 16 and result["reach"]["learned"]["beyond"] == 32
    table = list(csv.reader(io.StringIO(cc.csv_text(result))))
    assert tuple(table[0]) == cc.CSV_COLUMNS and len(table) == 3
    cells = dict(zip(table[0], table[2], strict=True))
    assert cells["status"] == "cannot measure" and cells["us_per_token"] == "" and cells["peak_mib"] == ""


def test_plot_has_two_log_log_panels_with_a_line_per_measured_scheme() -> None:
    from posenc_cli.perf.cost_plot import cost_curve_figure

    rows = [{**measured(n, n / 1e4, n / 100), "us_per_token": 100.0} for n in (1024, 2048)]
    rows.append({"scheme": "learned", "length": 1024, "status": cc.CANNOT, "reason": "x"})
    result = {
        "rows": rows, "schemes": ["t5", "learned"], "lengths": [1024, 2048], "memory_limit_applied_gib": 24,
        "config": asdict(TINY), "precision": "fp32", "device": "cpu (x)", "threads": 2,
        "memory_measure": "peak resident set (VmHWM) of the case's own process",
    }  # fmt: skip
    time_ax, mem_ax = cost_curve_figure(result).axes
    assert time_ax.get_xscale() == mem_ax.get_xscale() == "log" and time_ax.get_yscale() == "log"
    assert [line.get_label() for line in time_ax.lines] == ["t5"]  # learned: nothing measured, no line
    assert list(mem_ax.lines[0].get_ydata()) == pytest.approx([250 + 10.24, 250 + 20.48])
    assert "2 threads" in cost_curve_figure(result)._suptitle.get_text()
