#!/usr/bin/env bash
# bash benchmarks/gpu-check.sh            # on a machine with an NVIDIA GPU, from the repository root (about 8 min; at most 15)
# bash benchmarks/gpu-check.sh --check    # only check the environment and list the steps; run nothing
# bash benchmarks/gpu-check.sh --only compile-step,sweep-share    # some of the steps (names as below; at most 6 min)
#
# One prepared check of posenc's GPU path, with one summary at the end:
#   1. cuda-tests: the CUDA-marked tests (bf16 autocast training, the chunked attention-bias path in bf16 vs fp32,
#      ALiBi/T5/FIRE bias precision at 8k tokens, DDP over NCCL when more than one GPU is present);
#   2. test-suite: the rest of the test suite with CUDA available (bounded by GPU_CHECK_SUITE_S seconds, default
#      180; on a 16-core H200 machine it took about 120 s with 8 workers);
#   3. bench-fp32, bench-bf16: posenc bench --vs hf on model=small (evaluation cases: rope and alibi at 1x and 8x);
#   4. main-job: the main job (posenc sweep --profile) and its wall time;
#   5. compile-step: a model=tiny training step eager vs train.compile=true vs reduce-overhead (compile_step.py);
#   6. sweep-share: a 5-job tiny sweep, one job after another vs 5 at once on the GPU (sweep_share.py);
#   7. cost-curve: posenc bench --eval-lengths 1k..64k on the GPU, every scheme (time per token, peak memory);
#   8. flex: FlexAttention's CUDA tests (gradients) and flex_vs_chunked.py at 8k and 32k: the numbers that set
#      attention/choose.py's FLEX_MIN_LEN for cuda.
# Each step has a time limit (CUDA tests 90 s, suite 180 s, each bench 75 s, main job 110 s, compile 150 s, sweeps
# 180 s, cost curve 120 s, flex 150 s): at most 20 minutes in all, more than one session's device time: pick with
# --only. Without a GPU (or with CUDA_VISIBLE_DEVICES="") it prints "no GPU: skipped" and
# exits 0.
# Outputs go to GPU_CHECK_OUT (default outputs/gpu-check-<date>-<time>); the summary is also summary.txt there.
# Exit status: 0 when every step passed (or there is no GPU), 1 otherwise.
set -u -o pipefail

PY="${PYTHON:-python}"
CHECK_ONLY=0
ALL_STEPS=(cuda-tests test-suite bench-fp32 bench-bf16 main-job compile-step sweep-share cost-curve flex)
STEPS=("${ALL_STEPS[@]}")
while [ $# -gt 0 ]; do
    case "$1" in
        --check) CHECK_ONLY=1 ;;
        --only)
            [ $# -ge 2 ] || { echo "gpu-check: --only needs step names (${ALL_STEPS[*]})" >&2; exit 2; }
            IFS=, read -r -a STEPS <<<"$2"
            [ ${#STEPS[@]} -gt 0 ] || { echo "gpu-check: --only needs step names (${ALL_STEPS[*]})" >&2; exit 2; }
            for step in "${STEPS[@]}"; do
                if [[ " ${ALL_STEPS[*]} " != *" $step "* ]]; then
                    echo "gpu-check: unknown step $step (steps: ${ALL_STEPS[*]})" >&2
                    exit 2
                fi
            done
            shift ;;
        -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown argument $1 (use --check, --only or --help)" >&2; exit 2 ;;
    esac
    shift
done
want() { [[ " ${STEPS[*]} " == *" $1 "* ]]; }

cd "$(dirname "$0")/.." || exit 2

gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null)
if [ -z "$gpus" ]; then
    echo "gpu-check: '$PY' cannot import torch (activate posenc's environment first)" >&2
    exit 2
fi
if [ "$gpus" -eq 0 ]; then
    echo "gpu-check: no GPU: skipped (torch sees no CUDA device)"
    exit 0
fi

OUT="${GPU_CHECK_OUT:-outputs/gpu-check-$(date +%Y%m%d-%H%M%S)}"
SUITE_S="${GPU_CHECK_SUITE_S:-180}"
if [ "$CHECK_ONLY" -eq 1 ]; then
    echo "gpu-check: $gpus GPU(s) visible; would run: ${STEPS[*]} (outputs in $OUT)"
    exit 0
fi
mkdir -p "$OUT"
T0=$(date +%s)

declare -a SUMMARY
failed=0
note() { SUMMARY+=("$(printf '%-12s %-5s %s' "$1" "$2" "$3")"); [ "$2" = FAIL ] && failed=1; return 0; }
seconds() { echo $(($(date +%s) - $1)); }
last_line() { grep -E "$1" "$2" | tail -n 1; }

echo "== environment"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: n/a"
    "$PY" -c 'import torch, posenc_cli; print("torch", torch.__version__, "cuda", torch.version.cuda,
"bf16", torch.cuda.is_bf16_supported(), "posenc", posenc_cli.__version__)'
} | tee "$OUT/environment.txt"

if want cuda-tests; then
echo "== 1. CUDA-marked tests"
t=$(date +%s)
if timeout 90 "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/perf/test_cuda.py 2>&1 | tee "$OUT/cuda-tests.log"; then
    note cuda-tests PASS "$(last_line 'passed|failed|skipped' "$OUT/cuda-tests.log") ($(seconds "$t") s)"
else
    note cuda-tests FAIL "$(last_line 'passed|failed|error' "$OUT/cuda-tests.log") ($(seconds "$t") s)"
fi
fi

if want test-suite; then
echo "== 2. test suite with CUDA available (at most $SUITE_S s)"
t=$(date +%s)
workers=$(($(nproc) > 8 ? 8 : $(nproc)))
timeout "$SUITE_S" "$PY" -m pytest -q -n "$workers" -m "not cuda" -p no:cacheprovider 2>&1 | tee "$OUT/test-suite.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then
    note test-suite PASS "$(last_line 'passed|failed' "$OUT/test-suite.log") ($(seconds "$t") s)"
elif [ "$rc" -eq 124 ]; then
    note test-suite FAIL "did not finish within $SUITE_S s (GPU_CHECK_SUITE_S raises the bound)"
else
    note test-suite FAIL "$(last_line 'passed|failed|error' "$OUT/test-suite.log") ($(seconds "$t") s)"
fi
fi

for dtype in fp32 bf16; do
    want "bench-$dtype" || continue
    echo "== 3. posenc bench --vs hf, model=small, $dtype"
    t=$(date +%s)
    if timeout 75 "$PY" -m posenc_cli bench model=small --vs hf --dtypes "$dtype" --rounds 3 \
        --lengths 1,8 --schemes rope,alibi --json "$OUT/bench-$dtype.json" 2>&1 | tee "$OUT/bench-$dtype.log"; then
        detail=$("$PY" - "$OUT/bench-$dtype.json" <<'EOF'
import json, sys
entry = next(v for k, v in json.load(open(sys.argv[1])).items() if k in ("fp32", "bf16"))
if "skipped" in entry:
    print("skipped:", entry["skipped"])
else:
    keys = ("posenc_tokens_per_s", "hf_tokens_per_s", "ratio_vs_hf", "mfu", "matmul_peak_gflops")
    print(" ".join(f"{k}={entry[k]:.4g}" for k in keys if isinstance(entry.get(k), (int, float))))
EOF
)
        note "bench-$dtype" PASS "${detail:-ok} ($(seconds "$t") s)"
    else
        note "bench-$dtype" FAIL "see $OUT/bench-$dtype.log ($(seconds "$t") s)"
    fi
done

if want main-job; then
echo "== 4. the main job"
t=$(date +%s)
if timeout 110 "$PY" -m posenc_cli sweep --out "$OUT/main-job" --profile 2>&1 | tee "$OUT/main-job.log"; then
    note main-job PASS "wall $(seconds "$t") s; $(last_line '^whole sweep' "$OUT/main-job.log")"
else
    note main-job FAIL "after $(seconds "$t") s; see $OUT/main-job.log"
fi
fi

if want compile-step; then
echo "== 5. a model=tiny training step, eager vs compiled"
t=$(date +%s)
if timeout 150 "$PY" benchmarks/compile_step.py --device cuda --modes eager,default,reduce-overhead --rounds 5 \
    --json "$OUT/compile-step.json" 2>&1 | tee "$OUT/compile-step.log"; then
    detail=$("$PY" - "$OUT/compile-step.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
print("; ".join(f"{m} {v['ms_per_step']:.2f} ms ({v['speed_vs_eager']:.2f}x)" for m, v in r.items()))
PYEOF
)
    note compile-step PASS "$detail ($(seconds "$t") s)"
else
    note compile-step FAIL "see $OUT/compile-step.log ($(seconds "$t") s)"
fi
fi

if want sweep-share; then
echo "== 6. a 5-job sweep, one job at a time vs 5 at once on the GPU"
t=$(date +%s)
if timeout 180 "$PY" benchmarks/sweep_share.py --jobs 5 --steps 200 --lengths 1,2 --out "$OUT/sweep-share" \
    --json "$OUT/sweep-share.json" 2>&1 | tee "$OUT/sweep-share.log"; then
    detail=$("$PY" - "$OUT/sweep-share.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
walls = ", ".join(f"{k} {v['wall_s']:.0f} s ({v['tokens_per_s']:,.0f} tok/s)" for k, v in d["results"].items())
print(f"{walls}; {d['speedup']:.2f}x; max val_loss diff {d['max_val_loss_diff']:.2g}")
PYEOF
)
    note sweep-share PASS "$detail ($(seconds "$t") s)"
else
    note sweep-share FAIL "see $OUT/sweep-share.log ($(seconds "$t") s)"
fi
fi

if want cost-curve; then
echo "== 7. the cost curve: an evaluation forward per scheme and length on the GPU"
t=$(date +%s)
if timeout 120 "$PY" -m posenc_cli bench --eval-lengths 1024,4096,16384,65536 train.device=cuda --time-budget 6 \
    --json "$OUT/cost-curve.json" --plot "$OUT/cost-curve.png" 2>&1 | tee "$OUT/cost-curve.log"; then
    note cost-curve PASS "$OUT/cost-curve.json, cost-curve.png ($(seconds "$t") s)"
else
    note cost-curve FAIL "see $OUT/cost-curve.log ($(seconds "$t") s)"
fi
fi

if want flex; then
echo "== 8. FlexAttention on the GPU: its CUDA tests, then flex vs today's roads at 8k and 32k"
t=$(date +%s)
if timeout 150 bash -c "\"$PY\" -m pytest -q -m cuda tests/attention/test_flex.py && \"$PY\" benchmarks/flex_vs_chunked.py \
    --device cuda --lengths 8192,32768 --timeout 30 --json \"$OUT/flex.json\"" 2>&1 | tee "$OUT/flex.log"; then
    note flex PASS "$OUT/flex.json: set FLEX_MIN_LEN for cuda from it ($(seconds "$t") s)"
else
    note flex FAIL "see $OUT/flex.log ($(seconds "$t") s)"
fi
fi

{
    echo "== gpu-check summary ($gpus GPU(s); $(seconds "$T0") s in all; outputs in $OUT)"
    head -n 2 "$OUT/environment.txt"
    printf '%s\n' "${SUMMARY[@]}"
} | tee "$OUT/summary.txt"
exit "$failed"
