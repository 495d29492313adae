#!/usr/bin/env bash
# The GPU checks, for a lent CUDA machine (CI has no GPU and never runs this): the template project's CUDA tests,
# slow resume variants included, the sharded (FSDP2) checks with NCCL and bf16, the default job on the GPU, then
# benchmarks/overhead.py --gpu: the default path, the fast path (configs/fast.yaml) against the plain hand loop,
# precision, features, channels_last and compile.
# Run from the repository root; logs go to $OUT (default /tmp/gpu_check).
# Wheels in .whl/ (packages that machine lacks: torchdata, jsonargparse, ...) are installed first.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
fi
cd "template/{{cookiecutter.project_slug}}" || exit 1
export PYTHONPATH=src:tests:tests/classifier PYTHONUNBUFFERED=1
summary="$OUT/summary.txt"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)"
} | tee "$summary"

DEADLINE=${DEADLINE:-540}  # seconds for everything below; each step gets at most what is left
run_for() {  # seconds, command...: run it with a timeout of at most the time left; skip it when none is left
    local left=$((DEADLINE - SECONDS)) limit=$1
    shift
    if ((left < 20)); then echo "skipped (time is up): $*" | tee -a "$summary"; return 124; fi
    timeout $((limit < left ? limit : left)) "$@"
}

start=$SECONDS
run_for 240 python3 -m pytest tests/test_gpu.py tests/test_clipping.py tests/classifier/test_gpu_fast_path.py \
    -m "slow or not slow" -p no:cacheprovider -q -rs 2>&1 | tee "$OUT/test_gpu.log" | tail -4 | tee -a "$summary"
echo "CUDA tests: $((SECONDS - start)) s" | tee -a "$summary"

# configs/fsdp.yaml on the GPUs: NCCL, bf16 compute with float32 reduction, the checkpoints' gloo group beside NCCL
# (tests/test_sharded_gpu.py: kill and resume bit-identical, evaluation on one GPU; with 2+ GPUs a rank stalled or
# killed inside a save). On a machine with one GPU the checks between processes skip, saying why.
start=$SECONDS
run_for 180 python3 -m pytest tests/test_sharded_gpu.py -m "slow or not slow" -p no:cacheprovider -q -rs -s 2>&1 |
    tee "$OUT/test_sharded_gpu.log" | grep -E "passed|failed|skipped|error|SKIPPED|every process ended" | tail -6 |
    tee -a "$summary"
echo "sharded GPU tests: $((SECONDS - start)) s" | tee -a "$summary"

start=$SECONDS
run_for 60 python3 -m template_package fit --trainer.default_root_dir=/tmp/gpu_default_run \
    --trainer.enable_progress_bar=false >"$OUT/default_fit.log" 2>&1
code=$?
accuracy=$(python3 -c "from conftest import scalars; print(scalars('/tmp/gpu_default_run')['val/acc'][-1])" 2>&1 | tail -1)
echo "default fit: exit $code, $((SECONDS - start)) s wall, last (step, val/acc) $accuracy" | tee -a "$summary"

bench() {  # name, timeout, then overhead.py options
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*" >>"$OUT/bench.log"
    run_for "$limit" python3 benchmarks/overhead.py --gpu --epochs 3 --repeats 2 "$@" 2>&1 |
        grep -v -E "━|Warning|warn\(" | tee -a "$OUT/bench.log" |
        grep -E "median|per repeat|wait share|overhead ratio|Error|Exception|skipped" | sed "s/^/$name: /" |
        tee -a "$summary"
}
# Most important first: the default path (goal: overhead ratio <= 1/0.98), the fast path against the plain hand loop
# (goal: overhead ratio <= 0.67, i.e. 1.5x its samples/s), Lightning's floor; then the single switches.
bench bf16 90 --precision bf16-mixed --num-workers 4
bench fast 180 --config configs/fast.yaml
bench bf16-bare 90 --precision bf16-mixed --features bare --num-workers 4
bench bf16-off 90 --precision bf16-mixed --features off --num-workers 4
bench fp16 90 --precision 16-mixed --num-workers 4
bench bf16-channels-last 90 --precision bf16-mixed --channels-last --num-workers 4
bench bf16-compile 120 --precision bf16-mixed --compile --num-workers 4
echo "total: $SECONDS s" | tee -a "$summary"
