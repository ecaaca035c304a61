#!/usr/bin/env bash
# The fit lease: one rank of each production layout in benchmarks/fit_lease/layouts.json on ONE GPU
# under megatron-core 0.19.2's fake process group (benchmarks/device/fit.py), with Transformer
# Engine 2.20.2 (benchmarks/device_setup.sh te, .deps/tecarry carried; see te_bundle.sh) and the
# megatron-core wheel in .whl (made here as benchmarks/device/tune.sh's header says; only
# megatron-core is needed, TE's pydantic comes from .deps/tecarry). From the repo root:
#   bash benchmarks/device/fit.sh start [NAME ...]   # set up, then the runs in their own session
#                                                    # (they outlive the call; logs in /tmp/fit-work)
#       FIT_LAYOUTS=benchmarks/fit_lease/unseen.json: the models the estimate never saw;
#       FIT_AB="NAME ...": then the fill A/B below of those layouts.json entries, in the same session
#   bash benchmarks/device/fit.sh wait SECONDS       # until they end or SECONDS pass; packs into $OUT
#   bash benchmarks/device/fit.sh ab [NAME ...]      # the fill A/B (default qwen3_30b_a3b's baseline
#       and plan): each layout with MOETUNE_FILL_FAKE=0 and =1, alternating, ROUNDS (2) times, a step
#       of 4 micro-batches, 10 iterations; `wait` as above, then the table:
#       python3 benchmarks/device/fit.py --ab /tmp/fit-work/logs (or the packed fit_logs.tar.xz's logs)
# A call ends well inside its 600 s limit; the next `wait` call goes on while the machine is warm.
# The runs start from a copy of the code in /tmp/fit-repo: a run started while the device tool
# re-sends the working tree (the next call) failed at start from inside it ("Intel oneMKL FATAL
# ERROR: Cannot load libtorch_cpu.so", rc 2 within a second; seen on 2026-11-23).
set -u
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/fit-work
export PYTHONPATH="/tmp/site-gpu:/tmp/site:$PWD"

pack() {
  [ -d "$W/logs" ] || return 0
  tar cf - -C "$W" logs | xz -T0 -6 > "$OUT/fit_logs.tar.xz"
  cp "$W/logs/results.jsonl" "$OUT/" 2>/dev/null
  tail -n 20 "$W/driver.log"
}

setup() {
    t0=$SECONDS
    if ! python3 -c 'import megatron.core' 2>/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/megatron_core-*.whl || exit 1
    fi
    bash benchmarks/device_setup.sh te || exit 1
    echo "setup: $((SECONDS - t0)) s"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c 'import torch, megatron.core, transformer_engine as te; print("torch", torch.__version__,
"megatron-core", megatron.core.__version__, "TE", te.__version__)'
    rm -rf "$W" /tmp/fit-repo && mkdir -p "$W/logs" /tmp/fit-repo
    cp -a moetune benchmarks /tmp/fit-repo/ || exit 1
}

# the fill A/B: each layout with MOETUNE_FILL_FAKE=0 and =1, alternating, ROUNDS (2) times; world
# 16, EP 16: 16 data-parallel ranks, so a global batch of 64 is 4 micro-batches a step
ab_rounds() {
  local w=$1; shift
  for r in $(seq "${ROUNDS:-2}"); do for f in 0 1; do
    MOETUNE_FILL_FAKE=$f FIT_EXTRA_ARGS="--train-iters 10 --global-batch-size 64 --profile-step-start 11 --profile-step-end 11" \
      python3 benchmarks/device/fit.py "$w/logs/fill${f}_r$r" "$@"
  done; done
  python3 benchmarks/device/fit.py --ab "$w/logs"
}
export -f ab_rounds

case "${1:-}" in
  start)
    shift
    setup
    # FIT_LAYOUTS picks another file of entries (benchmarks/fit_lease/unseen.json); FIT_AB="NAME ..."
    # runs the fill A/B (below) of those layouts after the fits, in the same session
    (cd /tmp/fit-repo && PYTHONPATH="/tmp/site-gpu:/tmp/site:/tmp/fit-repo" setsid bash -c \
      'python3 benchmarks/device/fit.py "$0/logs" "$@" > "$0/driver.log" 2>&1
       if [ -n "${FIT_AB:-}" ]; then FIT_LAYOUTS= ab_rounds "$0" $FIT_AB >> "$0/driver.log" 2>&1; fi
       touch "$0/done"' "$W" "$@" < /dev/null > /dev/null 2>&1 &)
    echo "started"
    ;;
  ab)
    shift
    [ $# -gt 0 ] || set -- qwen3_30b_a3b-baseline-r0 qwen3_30b_a3b-plan-r0
    setup
    (cd /tmp/fit-repo && PYTHONPATH="/tmp/site-gpu:/tmp/site:/tmp/fit-repo" \
      setsid bash -c 'ab_rounds "$0" "$@" > "$0/driver.log" 2>&1; touch "$0/done"' \
      "$W" "$@" < /dev/null > /dev/null 2>&1 &)
    echo "started"
    ;;
  wait)
    end=$((SECONDS + ${2:-500}))
    while [ ! -f "$W/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
    [ -f "$W/done" ] && echo "fit: all done" || echo "fit: still running"
    pack
    ;;
  *) echo "usage: $0 start [NAME ...] | ab [NAME ...] | wait SECONDS"; exit 2 ;;
esac
