#!/usr/bin/env bash
# On a CUDA machine: what CLIP_PRECISION=auto decides for ViT-B-32 (random weights) with the
# batcher's default largest image batch (64) and with 128, then every candidate's image throughput
# at batch 1 / 8 / 32 / 128 (torch fp32, fp16 / bf16 autocast, fp16 + CUDA graphs as the service
# captures them, ONNX Runtime on the CUDA provider where onnxruntime-gpu is installed), and last the
# torch.compile (reduce-overhead) row if the time allows. About 2-3 minutes; every step is bounded.
#
#   PYTHONPATH=/tmp/site:$PWD:$PWD/clients/python bash scripts/gpu_checks_auto.sh
#
# PYTHON picks the interpreter (default: python3). Without a usable CUDA device it says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="${PYTHONPATH:-$PWD:$PWD/clients/python}"
start=$SECONDS

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    "$PY" -c 'import torch; print(f"gpu_checks_auto: no CUDA device here (torch {torch.__version__}, built for CUDA {torch.version.cuda}); nothing to measure")'
    exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
"$PY" -c 'import torch; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.get_device_name()}")'
lscpu 2>/dev/null | grep "Model name" || true

step() {  # step SECONDS LABEL COMMAND...
    local limit=$1 label=$2
    shift 2
    echo
    echo "== $label (at most ${limit} s; $((SECONDS - start)) s so far)"
    timeout "$limit" "$@"
    local rc=$?
    if [ "$rc" = 124 ]; then echo "== $label: ran past ${limit} s, stopped"; elif [ "$rc" != 0 ]; then echo "== $label: exit status $rc"; fi
}

# 1. auto at the service's default largest batch (64), with every row of the table at 1/8/32/128.
step 120 "auto (max batch 64) and the candidates at batch 1/8/32/128" \
    "$PY" -m loadtests.bench_cuda --arch ViT-B-32 --auto --max-batch 64 --batch-sizes 1 8 32 128 \
    --min-seconds 0.5 --rounds 2 --skip-compile
# 2. auto with a largest batch of 128 (CLIP_BATCHING__MAX_BATCH_IMAGES=128), its decision only.
step 40 "auto (max batch 128)" \
    "$PY" -m loadtests.bench_cuda --arch ViT-B-32 --auto --max-batch 128 --batch-sizes 1 --only none \
    --min-seconds 0.1 --rounds 1 --skip-compile
# 3. torch.compile(mode="reduce-overhead") against torch fp32, in what is left of 3 minutes.
left=$((170 - (SECONDS - start)))
if [ "$left" -gt 30 ]; then
    step "$left" "torch.compile reduce-overhead row" \
        "$PY" -m loadtests.bench_cuda --arch ViT-B-32 --batch-sizes 1 8 32 128 --min-seconds 0.5 --rounds 1 \
        --only "torch.compile"
else
    echo "== torch.compile row left out: ${left} s left of 3 minutes"
fi
echo
echo "gpu_checks_auto: done in $((SECONDS - start)) s"
