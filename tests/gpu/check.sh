#!/usr/bin/env bash
# The one-call GPU check: on a fresh GPU machine without network (PyTorch,
# the NCCL wheel and an MPI installed; wheels for cffi and pycparser carried
# in a folder), builds the core, runs tests/gpu, the CUDA benchmark at 2 and
# 4 ranks (and broadcast --aligned at 4), ResNet-50 (or the transformer,
# without torchvision) against DDP at 2 ranks with commlib's timeline by
# phase, the CPU scale benchmark at 4, 8 and 16 ranks, then with what is
# left the model at 4 ranks, the transformer in bf16 at 2 and ResNet-50 with
# SyncBatchNorm (commlib's against torch's under DDP) at 2, and writes ONE
# report (markdown) with every table. Every step runs under its own time
# limit, cut to what is left of the whole
# budget (480 s), so the check ends within 8 minutes whatever hangs.
#
#   tests/gpu/check.sh --wheels DIR [--report FILE]      # the whole check
#   tests/gpu/check.sh --dry-run                         # the steps and limits, nothing run
#   tests/gpu/check.sh --cpu-only --ranks "2" --no-build # only the CPU part (CI)
#
# Options: --wheels DIR (cffi/pycparser wheels: installed with --target into
# DIR/pydeps, put on PYTHONPATH), --report FILE (default
# gpu-check-<date>.md), --no-build, --cpu-only, --ranks "4 8 16" (the CPU
# part's ranks), --cpu-bench-args "..." (replaces the CPU bench's size and
# iteration options), --budget SECONDS. Environment: PYTHON (default python3
# on PATH), COMMLIB_MPICXX (default /usr/bin/mpicxx when it exists).
set -u

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-$(command -v python3)}"
DRY=0 CPU_ONLY=0 BUILD=1 WHEELS="" BUDGET=480 CPU_RANKS="4 8 16"
REPORT="gpu-check-$(date +%Y%m%d-%H%M%S).md"
CPU_BENCH_ARGS="--ops allreduce,alltoall,allgather --min-bytes 4K --max-bytes 64M --factor 4 --iters 20"
CUDA_BENCH_ARGS="--device cuda --min-bytes 4K --max-bytes 16M --factor 16 --iters 10"

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --cpu-only) CPU_ONLY=1 ;;
    --no-build) BUILD=0 ;;
    --wheels) WHEELS="$2"; shift ;;
    --report) REPORT="$2"; shift ;;
    --ranks) CPU_RANKS="$2"; shift ;;
    --cpu-bench-args) CPU_BENCH_ARGS="$2"; shift ;;
    --budget) BUDGET="$2"; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$(id -u)" = 0 ]; then  # (Open MPI refuses root without these)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
if [ -n "$WHEELS" ]; then
  DEPS="$(cd "$WHEELS" 2>/dev/null && pwd)/pydeps"
  export PYTHONPATH="$DEPS${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${COMMLIB_MPICXX:-}" ] && [ -x /usr/bin/mpicxx ]; then export COMMLIB_MPICXX=/usr/bin/mpicxx; fi

START=$(date +%s) PLANNED=0
SUMMARY=""
OUT="$(mktemp)"
trap 'rm -f "$OUT" "$OUT".timeline*' EXIT

say() { [ "$DRY" = 1 ] || printf '%s\n' "$@" >> "$REPORT"; }

# step NAME LIMIT_S COMMAND...: runs COMMAND for at most LIMIT_S seconds (less
# if the budget has less left), and appends its command, status, time and
# output to the report.
step() {
  local name="$1" limit="$2" left rc t0 t1 status
  shift 2
  left=$((BUDGET - ($(date +%s) - START)))
  [ "$DRY" = 1 ] && left=$((BUDGET - PLANNED))  # (a dry run plans every step at its whole limit)
  [ "$limit" -gt "$left" ] && limit="$left"
  if [ "$DRY" = 1 ]; then
    local shown="$*"
    printf '[%4ss] %s\t%s\n' "$limit" "$name" "${shown//$'\n'/ }"
    PLANNED=$((PLANNED + limit))
    return 0
  fi
  say "" "## $name" "" "\`$*\` (limit ${limit} s)" ""
  if [ "$limit" -lt 5 ]; then
    say "**skipped**: the ${BUDGET} s budget is spent"
    SUMMARY="$SUMMARY| $name | skipped | 0 |"$'\n'
    return 0
  fi
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$OUT" 2>&1
  rc=$?
  t1=$(date +%s)
  case $rc in
    0) status="ok" ;;
    124|137) status="TIMED OUT" ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  say "$status in $((t1 - t0)) s" "" '```'
  tail -n 300 "$OUT" >> "$REPORT"
  say '```'
  SUMMARY="$SUMMARY| $name | $status | $((t1 - t0)) |"$'\n'
  echo "check.sh: $name: $status ($((t1 - t0)) s)" >&2
}

# commlibrun, with the interpreter by absolute path (../shared/GPU.md); a
# model step's commlibrun --timeout is below its limit, so that a hang prints
# each rank's stacks and engine state before the step is stopped
RUN=("$PY" -m commlib.launch)
# the synthetic benchmark against DDP, each rank its own NCCL host (rank_env.sh)
COMPARE=("$ROOT/tests/gpu/rank_env.sh" "$PY" "$ROOT/examples/pytorch_synthetic_benchmark.py" --compare --device cuda)

if [ "$DRY" = 0 ]; then
  : > "$REPORT" || exit 2
  say "# commlib GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')" ""
  say "- host: $(hostname), $(nproc) cores; commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  say "- GPU: $(nvidia-smi -L 2>/dev/null | head -n 4 | tr '\n' ' ' || true)"
  say "- python: $PY; $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1)"
  say "- mode: $([ "$CPU_ONLY" = 1 ] && echo "CPU part only" || echo "GPU and CPU"); budget ${BUDGET} s"
fi

if [ "$CPU_ONLY" = 0 ]; then
  if [ "$BUILD" = 1 ]; then
    if [ -n "$WHEELS" ]; then
      step "install cffi and pycparser (wheels)" 15 "$PY" -m pip install --no-index --no-deps --target "$DEPS" \
        "$WHEELS"/*.whl
    fi
    step "build the core" 115 "$PY" -m pip install --no-build-isolation --no-deps -e "$ROOT"
  fi
  if "$PY" -c "import xdist" 2>/dev/null; then
    # (19 tests in 129 s with -n 6 on one H100; each test's time listed, a hung one fails at 120 s)
    step "tests/gpu" 150 "$PY" -m pytest -o addopts=-rs -v -n 6 --dist load --timeout 120 --durations=0 "$ROOT/tests/gpu"
  else  # (one pytest per test file, all at once, their outputs one after the other)
    step "tests/gpu (one pytest per file at once: no pytest-xdist)" 150 bash -c '
      py="$0" logs="$(mktemp -d)" rc=0 pids=()
      for f in "$@"; do "$py" -m pytest -o addopts=-rs -q "$f" > "$logs/$(basename "$f").log" 2>&1 & pids+=($!); done
      for p in "${pids[@]}"; do wait "$p" || rc=1; done
      cat "$logs"/*.log
      rm -rf "$logs"
      exit $rc' "$PY" "$ROOT"/tests/gpu/test_*.py
  fi
  # shellcheck disable=SC2086
  step "CUDA bench, 2 ranks" 25 "${RUN[@]}" -np 2 --timeout 25 "$PY" -m commlib.bench $CUDA_BENCH_ARGS
  # shellcheck disable=SC2086
  step "CUDA bench, 4 ranks" 35 "${RUN[@]}" -np 4 --timeout 35 "$PY" -m commlib.bench $CUDA_BENCH_ARGS
  # shellcheck disable=SC2086
  step "CUDA broadcast, 4 ranks, aligned (one call's latency)" 25 "${RUN[@]}" -np 4 --timeout 25 "$PY" -m commlib.bench \
    $CUDA_BENCH_ARGS --ops broadcast --aligned
  MODEL=resnet50
  "$PY" -c "import torchvision" 2>/dev/null || MODEL=transformer
  TRACE="$OUT.timeline.json"  # (commlib's collectives: where its first step's time goes)
  step "$MODEL: commlib against DDP, 2 ranks" 100 env COMMLIB_TIMELINE="$TRACE" "${RUN[@]}" -np 2 --timeout 92 \
    "${COMPARE[@]}" \
    --model "$MODEL" --num-warmup-batches 2 --num-batches-per-iter 5 --num-iters 4
  step "$MODEL: commlib's timeline by phase" 5 "$PY" -m commlib.timeline phases "$TRACE"
fi
for n in $CPU_RANKS; do
  limit=$((15 + 2 * n))
  # shellcheck disable=SC2086
  step "CPU scale: allreduce, alltoall and allgather against MPI, $n ranks" "$limit" env CUDA_VISIBLE_DEVICES= \
    "${RUN[@]}" -np "$n" --timeout "$limit" "$PY" -m commlib.bench --no-gloo --no-fusion $CPU_BENCH_ARGS
done

if [ "$CPU_ONLY" = 0 ]; then  # (last: what the budget has left; a hang prints each rank's stacks)
  step "$MODEL: commlib against DDP, 4 ranks" 60 "${RUN[@]}" -np 4 --timeout 52 \
    "${COMPARE[@]}" \
    --model "$MODEL" --num-warmup-batches 2 --num-batches-per-iter 3 --num-iters 3
  step "transformer bf16: commlib against DDP, 2 ranks" 60 "${RUN[@]}" -np 2 --timeout 52 \
    "${COMPARE[@]}" \
    --model transformer --amp bf16 --num-warmup-batches 2 --num-batches-per-iter 5 --num-iters 3
  if [ "$MODEL" = resnet50 ]; then  # (SyncBatchNorm: commlib's against torch's under DDP)
    step "resnet50 SyncBatchNorm: commlib against DDP, 2 ranks" 50 "${RUN[@]}" -np 2 --timeout 42 \
      "${COMPARE[@]}" \
      --model resnet50 --sync-bn --num-warmup-batches 2 --num-batches-per-iter 3 --num-iters 3
  fi
fi

if [ "$DRY" = 0 ]; then
  say "" "## Summary ($(( $(date +%s) - START )) s)" "" "| step | status | seconds |" "|---|---|---|"
  printf '%s' "$SUMMARY" >> "$REPORT"
  echo "check.sh: report in $REPORT" >&2
  case "$SUMMARY" in *"FAILED"*|*"TIMED OUT"*) exit 1 ;; esac
fi
exit 0
