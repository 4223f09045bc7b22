#!/usr/bin/env bash
# Front-ends and an engine (CLIP_WORKERS) on a many-core machine, and on its GPU when it has one.
#
#   1. The tiny ViT on the CPU, /embed, one unique JPEG per request, with 1, 2, 4 and 8 front-ends
#      (those that fit the cores; w1 is the single process with every core as intra-op threads,
#      wN gives the engine the cores the N front-ends leave).
#   2. With a CUDA GPU: the tower ceiling of ViT-B-32 as precision=auto chooses it (bench_cuda
#      --auto), then /embed on ViT-B-32 (CLIP_DEVICE=cuda, CLIP_PRECISION=auto) at c=8, 64, 256 with
#      the same front-end counts, each cell also as a share of that ceiling.
#
# Ends with the summary of loadtests/device_summary.py (req/s, speed-up over w1, engine CPU per
# answer, % of the tower). Everything lands in $OUT (default ./device-host-path). About 3 minutes
# for part 1 on 16 cores, 5 more for part 2. --quick: cells of two seconds, to check that it runs
# (on any machine, a 2-core laptop included).
#
#     bash loadtests/device_host_path.sh            # the figures
#     bash loadtests/device_host_path.sh --quick    # does it run here?
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
OUT="${OUT:-device-host-path}"
mkdir -p "$OUT"
CORES=$(nproc)
WRK_THREADS=$(( CORES >= 8 ? 2 : 1 ))  # one wrk thread tops out near 3,000 small requests/s
if [ "${1:-}" = "--quick" ]; then
  DURATION=2 WARMUP=1 CPU_C="8" GPU_C="8 64" BASES=16 CEILING_S=0.5 TOWER_ROUNDS=1
else
  DURATION=8 WARMUP=2 CPU_C="8 64 128" GPU_C="8 64 256" BASES=256 CEILING_S=3 TOWER_ROUNDS=2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# --service flags for 1, 2, 4 and 8 front-ends (those that fit the cores); $1: more ENV=VALUE pairs.
variants() {
  local extra="$1" n threads
  for n in 1 2 4 8; do
    if [ "$n" = 1 ]; then
      echo "--service w1:CLIP_WORKERS=1$extra"
    elif [ "$n" -le "$CORES" ]; then
      threads=$(( CORES > n ? CORES - n : 1 ))
      echo "--service w$n:CLIP_WORKERS=$n,CLIP_TORCH_THREADS=$threads,OMP_NUM_THREADS=$threads,MKL_NUM_THREADS=$threads$extra"
    fi
  done
}

echo "== $(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1), $CORES cores"
echo "== 1. tiny ViT on the CPU: 1, 2, 4, 8 front-ends"
# shellcheck disable=SC2046  # one --service flag and its value per word
"$PY" -P -m loadtests.bench_host_path --no-infinity --endpoints embed --concurrency $CPU_C \
  --duration "$DURATION" --warmup "$WARMUP" --rounds 1 --threads "$CORES" --wrk-threads "$WRK_THREADS" \
  --bases "$BASES" --ceiling-duration "$CEILING_S" $(variants "") --json "$OUT/cpu_tiny.json" | tee "$OUT/cpu_tiny.txt"
runs=("$OUT/cpu_tiny.json")
tower=()

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "== 2a. ViT-B-32 tower ceiling on $("$PY" -c "import torch; print(torch.cuda.get_device_name())")"
  "$PY" -P -m loadtests.bench_cuda --arch ViT-B-32 --auto --batch-sizes 64 --rounds "$TOWER_ROUNDS" --skip-compile \
    | tee "$OUT/tower_b32.txt"
  echo "== 2b. ViT-B-32 /embed on CUDA (precision auto): 1, 2, 4, 8 front-ends"
  # shellcheck disable=SC2046
  "$PY" -P -m loadtests.bench_host_path --no-infinity --arch ViT-B-32 --endpoints embed --concurrency $GPU_C \
    --duration "$DURATION" --warmup "$WARMUP" --rounds 1 --threads "$CORES" --wrk-threads "$WRK_THREADS" \
    --bases "$BASES" --ceiling-duration "$CEILING_S" $(variants ",CLIP_DEVICE=cuda,CLIP_PRECISION=auto") \
    --json "$OUT/cuda_b32.json" | tee "$OUT/cuda_b32.txt"
  runs+=("$OUT/cuda_b32.json")
  tower=(--tower-log "$OUT/tower_b32.txt")
else
  echo "== 2. no CUDA device here: the GPU part is left out"
fi

echo "== summary"
"$PY" -P -m loadtests.device_summary "${runs[@]}" "${tower[@]}" | tee "$OUT/summary.md"
