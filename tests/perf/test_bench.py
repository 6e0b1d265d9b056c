"""`posenc bench`: FLOPs formula, the matching Llama, interleaving, one eval case per process, and the CLI's JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc_cli.cli import app
from posenc_cli.config import ModelConfig
from posenc_cli.perf import bench

runner = CliRunner()


def test_flops_per_token_is_six_n_plus_causal_attention() -> None:
    # d=256, 6 layers, T=128: 6·N + 6·6·256·128 (forward 2·d·T for q·kᵀ + 2·d·T for p·v, halved, ×3 with backward)
    assert bench.train_flops_per_token(4_800_000, 6, 256, 128) == 6 * 4_800_000 + 6 * 6 * 256 * 128
    assert bench.mfu(1000.0, 30_000_000, 100.0) == pytest.approx(0.3)


def test_llama_has_the_same_width_depth_heads_and_mlp_parameters() -> None:
    pytest.importorskip("transformers")
    from posenc_cli.model import MLP

    m = ModelConfig(d_model=64, n_layer=2, n_head=4, mlp_ratio=4)
    llama = bench.build_llama(m, vocab_size=100, max_length=32)
    cfg = llama.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 2, 4)
    assert cfg.num_key_value_heads == 4 and cfg.tie_word_embeddings
    llama_mlp = sum(p.numel() for p in llama.model.layers[0].mlp.parameters())  # 3·d·i, no biases
    ours = sum(p.numel() for n, p in MLP(m).named_parameters() if n.endswith("weight"))  # 2·mlp_ratio·d²
    assert abs(llama_mlp - ours) <= 3 * m.d_model  # i is rounded to an integer: at most d·3/2 apart
    assert bench.llama_intermediate_size(ModelConfig(d_model=256, mlp_ratio=4)) == 683


def test_rounds_interleave_the_cases() -> None:
    order: list[str] = []
    cases = {name: (lambda name=name: order.append(name) or 1.0) for name in ("a", "b", "c")}
    values = bench.interleaved_rounds(cases, rounds=3)
    assert order == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]  # every other round reversed
    assert values == {"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3}


def test_matmul_probe_measures_something() -> None:
    import torch

    gflops = bench.matmul_gflops(128, torch.float32, torch.device("cpu"), repeats=1)
    assert math.isfinite(gflops) and gflops > 0


def tiny_cfg():
    from posenc_cli.run.config_compose import compose_config

    overrides = ["model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=16", "train.batch_size=2"]
    return compose_config([*overrides, "train.threads=1", "train.device=cpu"], None)


@pytest.mark.integration  # a benchmark end to end
def test_bench_result_has_the_keys_for_both_dtypes() -> None:
    pytest.importorskip("transformers")
    opts = bench.BenchOptions(
        rounds=2, vs_hf=True, round_seconds=0.01, eval_schemes=("alibi",), eval_multiples=(4,), matmul_max_size=256
    )
    data = json.loads(json.dumps(bench.run_bench(tiny_cfg(), opts)))  # JSON-ready
    for dtype in ("fp32", "bf16"):
        r = data[dtype]
        for key in ("posenc_tokens_per_s", "hf_tokens_per_s", "ratio_vs_hf", "matmul_peak_gflops", "mfu"):
            assert math.isfinite(r[key]) and r[key] > 0, (dtype, key)
        assert r["ratio_vs_hf"] == pytest.approx(r["posenc_tokens_per_s"] / r["hf_tokens_per_s"])
        assert len(r["samples"]["posenc"]) == len(r["samples"]["hf"]) == len(r["samples"]["matmul"]) == 2
        case = r["eval"]["alibi"]["64"]  # 4 × train.seq_len, in its own process
        assert case["tokens_per_s"] > 0 and case["peak_mem_mb"] >= case["base_mem_mb"] > 0
    assert data["config"]["d_model"] == 32 and data["flops_per_token_formula"].startswith("6*N")


@pytest.mark.integration  # a benchmark end to end
def test_cli_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", "model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.seq_len=16"]
    args += ["train.batch_size=2", "train.threads=1", "--dtypes", "fp32", "--rounds", "1", "--round-seconds", "0"]
    result = runner.invoke(app, [*args, "--no-eval", "--json", str(out)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "posenc tok/s" in result.output and "MFU" in result.output
    assert "fp32, paired per round (median over 1 rounds): MFU" in result.output  # no Llama: no paired ratio
    data = json.loads(out.read_text())
    assert data["fp32"]["posenc_tokens_per_s"] > 0 and data["fp32"]["hf_tokens_per_s"] is None
    assert "bf16" not in data


def test_cli_refuses_unknown_dtype_and_baseline() -> None:
    bad = runner.invoke(app, ["bench", "--dtypes", "fp16"])
    assert bad.exit_code == 2 and "--dtypes" in bad.output
    bad = runner.invoke(app, ["bench", "--vs", "gpt2"])
    assert bad.exit_code == 2 and "hf" in bad.output
