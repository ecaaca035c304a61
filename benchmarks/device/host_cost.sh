#!/usr/bin/env bash
# The host's cost a launch, on the GPU machine: one rank of Qwen3-30B-A3B's baseline layout
# (benchmarks/fit_lease/layouts.json qwen3_30b_a3b-baseline-r0: EP 16 of a world of 16, capacity 1
# with padding, so no token counts to wait for) alone on one GPU under the fake process group, 16
# of its 48 layers, a step of 4 micro-batches; the host sets its pace. Each run is one of:
#   plain        no profiler: the step time a training without nsys has
#   nsys         the same under `nsys profile -t cuda,nvtx` (capture range iterations 10-12): what
#                tracing the CUDA API adds to the host, and the launches a step
#   gaf, gaf_nsys  --gradient-accumulation-fusion on (NVIDIA's images have apex; this one has a
#                stand-in, apex_standin/): the launches the fusion saves
#   cpusN        plain, the process pinned to N of the host's cores (taskset)
#   memLxMy, memgLxMy  x layers, y micro-batches a step, 7 iterations, without and with TE's CUDA graphs
#                of attn, moe_router and moe_preprocess (captured after 3 warm-up iterations), the
#                GPU's memory in use polled every 100 ms (NAME.mem): what the graphs' pools take
#   memLxMyPz, memgLxMyPz  the same as the first stage (rank 0) of z pipeline stages (a world of 16 z),
#                x layers over the z stages: Megatron captures every micro-batch there, not one
#   vppLxMyPzVw  x layers, y micro-batches, as the first of z pipeline stages with w virtual stages a
#                rank (14 iterations; V1: no virtual stages): what a virtual stage costs the host a
#                micro-batch beyond its bubble (the sends themselves are the fake group's no-ops)
#   vppLxMyPzVw_nsys  the same under nsys: its launches a step; _nop2p: the sends not overlapped
#                (--no-overlap-p2p-communication); _again: a second sample
#   NAME_prev    NAME with an earlier training entry, put by the caller (with its fake_fill.py) in
#                benchmarks/device/prev_entry/ (git-ignored, carried): an A/B of the entry itself
# From the repo root, with .whl, .devlib and .deps/tecarry carried:
#   bash benchmarks/device/host_cost.sh start [RUN ...]   # setup, then the runs in their own session
#   bash benchmarks/device/host_cost.sh wait SECONDS      # until they end or SECONDS pass; packs into $OUT
# Each run writes NAME.log (and NAME.sqlite.xz under nsys); `wait` prints a table of every run's
# iteration times.
set -u
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/host-cost; R=$W/runs
B=/opt/nvidia/nsight-compute/2025.3.1/host
N=$B/target-linux-x64/nsys
Q=$B/linux-desktop-glibc_2_11_3-x64/QdstrmImporter
RUNS_DEFAULT="plain nsys gaf_nsys gaf cpus2 cpus4 cpus8 plain_again"
# the same name twice (plain, plain_again): a second sample of the same run

# run NAME: one run from /tmp/host-code (a copy: the next call re-sends the checkout)
run() {
  local name=$1 pin=() pre=() fuse=0 path=/tmp/site-gpu:/tmp/site:/tmp/host-code
  case "$name" in
    cpus*) pin=(taskset -c "0-$(( ${name#cpus} - 1 ))") ;;
  esac
  case "$name" in
    *nsys) pre=("$N" profile -t cuda,nvtx -s none --cpuctxsw=none --capture-range=cudaProfilerApi
                --capture-range-end=stop -o "/tmp/$name" --force-overwrite true) ;;
  esac
  case "$name" in
    gaf*) fuse=1; path=/tmp/host-code/benchmarks/device/apex_standin:$path ;;
  esac
  local layers=16 gbs=64 iters=14 extra=()
  case "$name" in
    mem*) layers=${name#*L}; layers=${layers%M*}; mbs=${name##*M}; mbs=${mbs%P*}; gbs=$(( 16 * mbs )); iters=7 ;;
  esac
  local pp=1
  case "$name" in
    mem*P*) pp=${name##*P}; extra+=(--pipeline-model-parallel-size "$pp") ;;
    vpp*) local shape=${name%%_*} v
          layers=${shape#vppL}; layers=${layers%%M*}; mbs=${shape#*M}; mbs=${mbs%%P*}
          pp=${shape#*P}; pp=${pp%%V*}; v=${shape##*V}; gbs=$(( 16 * mbs ))
          extra+=(--pipeline-model-parallel-size "$pp")
          [ "$v" -gt 1 ] && extra+=(--num-virtual-stages-per-pipeline-rank "$v")
          case "$name" in *_nop2p*) extra+=(--no-overlap-p2p-communication) ;; esac ;;
  esac
  case "$name" in
    memg*) extra+=(--cuda-graph-impl transformer_engine --cuda-graph-modules attn moe_router moe_preprocess)
           export NCCL_GRAPH_REGISTER=0 ;;  # Megatron asks for it with expandable segments and graphs
  esac
  local poll=
  case "$name" in
    mem*) nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$R/$name.mem" &
          poll=$! ;;
  esac
  local entry=moetune/workloads/train_moe.py
  case "$name" in
    *_prev*) entry=benchmarks/device/prev_entry/train_moe.py
             [ -f "$entry" ] || { echo "{\"name\": \"$name\", \"rc\": 2, \"why\": \"no $entry\"}" > "$R/$name.json"; return; } ;;
  esac
  local argv
  # Megatron fuses by default; the layout turns it off (no apex in the image): a fused run drops that
  argv=$(FUSE=$fuse python3 -c 'import json, os, shlex
l = next(x for x in json.load(open("benchmarks/fit_lease/layouts.json")) if x["name"] == "qwen3_30b_a3b-baseline-r0")
print(shlex.join(a for a in l["argv"] if os.environ["FUSE"] == "0" or a != "--no-gradient-accumulation-fusion"))')
  eval "set -- $argv"
  local t0=$SECONDS
  env PYTHONPATH="$path" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True WORLD_SIZE=$(( 16 * pp )) RANK=0 LOCAL_RANK=0 \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 "${pin[@]}" "${pre[@]}" python3 -u "$entry" "$@" \
    --num-layers "$layers" --global-batch-size "$gbs" --train-iters "$iters" --profile-step-start 10 \
    --profile-step-end 12 "${extra[@]}" > "$R/$name.log" 2>&1 < /dev/null
  local rc=$?
  [ -n "$poll" ] && kill "$poll" 2>/dev/null
  if [ -f "/tmp/$name.qdstrm" ]; then LD_LIBRARY_PATH="$PWD/.devlib" "$Q" -i "/tmp/$name.qdstrm" > /dev/null 2>&1; fi
  if [ -f "/tmp/$name.nsys-rep" ]; then
    "$N" export --type sqlite -o "/tmp/$name.sqlite" --force-overwrite true "/tmp/$name.nsys-rep" > /dev/null 2>&1
    python3 benchmarks/slim_trace.py "/tmp/$name.sqlite" "$R/$name.sqlite" && xz -6 -T0 -f "$R/$name.sqlite"
    rm -f /tmp/"$name".*
  fi
  echo "{\"name\": \"$name\", \"rc\": $rc, \"wall_s\": $((SECONDS - t0))}" > "$R/$name.json"
}
export -f run
export N Q R

case "${1:-}" in
  start)
    shift; [ $# -gt 0 ] || set -- $RUNS_DEFAULT
    t0=$SECONDS
    if ! python3 -c 'import megatron.core' 2>/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/megatron_core-*.whl || exit 1
    fi
    bash benchmarks/device_setup.sh te > /tmp/host-te.log 2>&1 || { tail -5 /tmp/host-te.log; exit 1; }
    echo "setup: $((SECONDS - t0)) s"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|CPU max MHz)' | tr -s ' '
    rm -rf "$W" /tmp/host-code && mkdir -p "$R" /tmp/host-code && cp -a moetune benchmarks .devlib /tmp/host-code/ || exit 1
    (cd /tmp/host-code && setsid bash -c 'for n in "$@"; do run "$n"; done; touch "$0/done"' "$W" "$@" \
      < /dev/null > "$W/driver.log" 2>&1 &)
    echo "started: $*"
    ;;
  wait)
    end=$((SECONDS + ${2:-500}))
    while [ ! -f "$W/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
    [ -f "$W/done" ] && echo "host_cost: all done" || echo "host_cost: still running"
    for j in "$R"/*.json; do [ -e "$j" ] || continue; n=$(basename "$j" .json); mv "$R/$n".* "$OUT"/; done
    cp "$W/driver.log" "$OUT"/ 2>/dev/null
    tar cf - -C "$OUT" --exclude host_cost.tar.xz . | xz -T0 -6 > /tmp/host_cost.tar.xz  # at most 8 files come back
    for l in "$OUT"/*.log; do
      [ "$(basename "$l")" = driver.log ] && continue
      printf '%-12s %s\n' "$(basename "$l" .log)" "$(grep -o 'elapsed time per iteration (ms): [0-9.]*' "$l" | awk '{printf "%s ", $NF}')"
      grep -m2 -E 'Error|error:' "$l" | cut -c1-200
    done
    for m in "$OUT"/*.mem; do  # the GPU's most memory in use; the allocator's at the end, then emptied
      [ -e "$m" ] || continue
      printf '%-12s max used %s MiB; max reserved %s MB; held %s\n' "$(basename "$m" .mem)" "$(sort -n "$m" | tail -1)" \
        "$(grep -o 'max reserved: [0-9.]*' "${m%.mem}.log" | tail -1 | awk '{print $NF}')" \
        "$(grep -o 'emptying the cache.*' "${m%.mem}.log" | tail -1)"
    done
    find "$OUT" -mindepth 1 -delete && mv /tmp/host_cost.tar.xz "$OUT"/ && ls -la "$OUT"
    ;;
  *) echo "usage: $0 start [RUN ...] | wait SECONDS"; exit 2 ;;
esac
