#!/usr/bin/env bash
# On the GPU machine (device tool), from the repo root, with .whl and .devlib carried:
#   bash benchmarks/device/run.sh scenarios            # analysis test scenarios
#   bash benchmarks/device/run.sh bank [NAME ...]      # trial bank configs (default: all)
#   bash benchmarks/device/run.sh sweep EXPERIMENT [NAME ...]   # benchmarks/device/comm_sweep.py's runs,
#        every rank under nsys, each with its environment (the slow link: NCCL_P2P_DISABLE=1);
#        SWEEP_PROFILE="NAME ...": only those under nsys, the rest plain (their logs' step times)
# Writes NAME.log, NAME.sqlite.xz and NAME.json (timings) under $OUT; prints a table last.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_DEVICE_MAX_CONNECTIONS=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=/opt/nvidia/nsight-compute/2025.3.1/host
N=$B/target-linux-x64/nsys
Q=$B/linux-desktop-glibc_2_11_3-x64/QdstrmImporter
if [ -d .whl ] && ! python3 -c 'import megatron.core' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
fi
# what benchmarks/device_setup.sh built (Transformer Engine, DeepEP) sits in /tmp/site-gpu
# `moetune` is not installed there: a folder holding a link named moetune to this checkout makes
# moetune and moetune.analysis importable from it (the same layout a wheel installs)
mkdir -p /tmp/moetune-src && ln -sfn "$PWD/moetune" /tmp/moetune-src/moetune
export PYTHONPATH="/tmp/site-gpu:/tmp/site:/tmp/moetune-src"
NGPU=$(nvidia-smi -L | wc -l)

# profile NAME CMD...: nsys around CMD, importer, export, slim, xz
profile() {
  local name=$1; shift
  local t0=$SECONDS
  "$N" profile -t cuda,nvtx -s none --cpuctxsw=none --cuda-memory-usage=true \
      --cuda-graph-trace=node --capture-range=cudaProfilerApi --capture-range-end=stop \
      -o "/tmp/$name" --force-overwrite true "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  if [ -f "/tmp/$name.qdstrm" ]; then
    LD_LIBRARY_PATH="$PWD/.devlib" "$Q" -i "/tmp/$name.qdstrm" > /dev/null 2>&1
  fi
  if [ -f "/tmp/$name.nsys-rep" ]; then
    "$N" export --type sqlite -o "/tmp/$name.sqlite" --force-overwrite true "/tmp/$name.nsys-rep" > /dev/null 2>&1
    python3 benchmarks/slim_trace.py "/tmp/$name.sqlite" "$OUT/$name.sqlite" && xz -9 -T0 -f "$OUT/$name.sqlite"
  fi
  echo "{\"name\": \"$name\", \"rc\": $rc, \"wall_s\": $((SECONDS - t0))}" > "$OUT/$name.json"
  rm -f /tmp/"$name".*
}

# plain NAME CMD...: CMD without nsys (its log's step times only: an A/B's other side)
plain() {
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  echo "{\"name\": \"$name\", \"rc\": $?, \"wall_s\": $((SECONDS - t0)), \"profiled\": false}" > "$OUT/$name.json"
}

summary() {
  printf '%-22s %4s %6s %10s %8s\n' name rc wall_s last_ms trace
  for j in "$OUT"/*.json; do
    n=$(basename "$j" .json)
    rc=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['rc'])" "$j")
    w=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['wall_s'])" "$j")
    ms=$(grep -o 'elapsed time per iteration (ms): [0-9.]*' "$OUT/$n.log" | tail -1 | awk '{print $NF}')
    tr=$( [ -f "$OUT/$n.sqlite.xz" ] && du -k "$OUT/$n.sqlite.xz" | cut -f1 || echo -)
    printf '%-22s %4s %6s %10s %8s\n' "$n" "$rc" "$w" "${ms:--}" "$tr"
  done
}

case "${1:-}" in
  scenarios)
    for s in a2a_hidden big_gemm tiny_kernels skew; do
      profile "$s" torchrun --standalone --nproc_per_node=2 benchmarks/scenarios/scenarios.py "$s"
    done
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 profile a2a_drowned \
      torchrun --nproc_per_node=2 benchmarks/scenarios/scenarios.py a2a_drowned
    t0=$SECONDS
    torchrun --nproc_per_node=2 benchmarks/scenarios/scenarios.py oom > "$OUT/oom.log" 2>&1
    echo "{\"name\": \"oom\", \"rc\": $?, \"wall_s\": $((SECONDS - t0))}" > "$OUT/oom.json"
    ;;
  bank)
    shift
    python3 benchmarks/device/bank_configs.py "$@" > /tmp/bank.txt || exit 1
    slot=0
    while read -r -u 3 name gpus args; do
      eval "set -- $args"
      if [ "$gpus" = 1 ]; then  # one-GPU configs run two at a time, one per GPU
        CUDA_VISIBLE_DEVICES=$slot profile "$name" torchrun --standalone --nproc_per_node=1 \
          moetune/workloads/train_moe.py "$@" < /dev/null &
        slot=$(( (slot + 1) % NGPU )); [ "$slot" = 0 ] && wait
      else
        wait
        profile "$name" torchrun --standalone --nproc_per_node="$gpus" moetune/workloads/train_moe.py "$@" < /dev/null
      fi
    done 3< /tmp/bank.txt
    wait
    ;;
  sweep)
    shift
    python3 benchmarks/device/comm_sweep.py "$@" > /tmp/sweep.txt || exit 2
    while read -r -u 3 name gpus env args; do
      eval "set -- $args"
      envs=(); [ "$env" = - ] || IFS=, read -r -a envs <<< "$env"
      # the run's variables are those moetune's job script gives its config (comm_sweep.run_env),
      # not this script's defaults
      ( unset CUDA_DEVICE_MAX_CONNECTIONS; for kv in "${envs[@]}"; do export "${kv?}"; done
        # CPUS=N: the whole job pinned to the host's first N cores (the host's launch cost
        # against the CPUs a rank has)
        pin=(); [ -n "${CPUS:-}" ] && pin=(taskset -c "0-$((CPUS - 1))")
        if [ -n "${SWEEP_PROFILE:-}" ] && [[ " $SWEEP_PROFILE " != *" $name "* ]]; then
          plain "$name" "${pin[@]}" torchrun --standalone --nproc_per_node="$gpus" moetune/workloads/train_moe.py "$@" < /dev/null
        else
          profile "$name" "${pin[@]}" torchrun --standalone --nproc_per_node="$gpus" moetune/workloads/train_moe.py "$@" < /dev/null
        fi )
    done 3< /tmp/sweep.txt
    ;;
  *) echo "usage: $0 scenarios | bank [NAME ...] | sweep EXPERIMENT [NAME ...]"; exit 2 ;;
esac
summary
