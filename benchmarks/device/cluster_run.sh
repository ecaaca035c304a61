#!/usr/bin/env bash
# What a first cluster run meets, on the GPU machine (no Slurm there): the preflight's record of the
# machine with Transformer Engine built, the jobs `moetune render` writes for it, and a one-GPU study
# whose trials run with the resources and environment the render gives them.
# Carry .whl (tune.sh's header), .devlib, .deps/tecarry and .whl18 (megatron-core 0.18.2's wheel, for
# the entry's older pretrain path) from a tree without the trial bank. Two calls, back to back:
#   bash benchmarks/device/cluster_run.sh first    # TE, preflight, render, the study started, waits
#   bash benchmarks/device/cluster_run.sh second   # waits for the study, the 0.18 entry, packs $OUT
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/moetune-cluster; mkdir -p "$W"
EXP=${EXP:-qwen3_30b_a3b}

case "${1:-}" in
  first)
    t0=$SECONDS
    bash benchmarks/device_setup.sh te > "$W/setup.log" 2>&1 || { tail -20 "$W/setup.log"; exit 1; }
    echo "te setup: $((SECONDS - t0)) s"
    # the probe sees TE where the trials do
    PYTHONPATH="/tmp/site-gpu:${PYTHONPATH:-}" bash benchmarks/device/preflight.sh probe > "$W/probe.txt" 2>&1
    echo "probe rc=$?"; cp "$OUT/preflight.json" "$W/"
    PYTHONPATH="/tmp/site-gpu:${PYTHONPATH:-}" bash benchmarks/device/preflight.sh cli > "$W/preflight_cli.txt" 2>&1
    echo "preflight cli rc=$?"; tail -25 "$W/preflight_cli.txt"
    ITERS=${ITERS:-12} MAX_TRIALS=${MAX_TRIALS:-2} bash benchmarks/device/tune.sh start --one-gpu "$EXP"
    # what the render gives the cluster's job and this machine's one-GPU trial
    export PYTHONPATH="/tmp/site:/tmp/moetune-src:${PYTHONPATH:-}"
    python3 -m moetune.cli.main render "$EXP" --out "$W/render_cluster" > "$W/render.txt" 2>&1
    python3 -m moetune.cli.main render "/tmp/moetune-tune/$EXP.yaml" --one-gpu --launcher local \
      --out "$W/render_one_gpu" >> "$W/render.txt" 2>&1
    cat "$W/render.txt"
    bash benchmarks/device/tune.sh wait $((560 - (SECONDS - t0)))
    ;;
  second)
    t0=$SECONDS
    bash benchmarks/device/tune.sh wait 330
    # the entry's older pretrain path (megatron-core 0.18.2) on this GPU: its check, then moe_proxy's
    # one-GPU trial job as the render writes it, run by hand for 6 iterations
    mkdir -p /tmp/mcore18 && python3 -m pip install -q --no-index --no-deps --target /tmp/mcore18 .whl18/*.whl
    PYTHONPATH=/tmp/mcore18 python3 moetune/workloads/train_moe.py --moetune-check > "$W/check18.json" 2>&1
    echo "0.18 check rc=$?: $(cat "$W/check18.json")"
    export PYTHONPATH="/tmp/site:/tmp/moetune-src"
    python3 - experiments/moe_proxy.yaml "$W/moe_proxy18.yaml" <<'EOF'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
d["cluster"].update(nsys="off", python="python3")
d["baseline"].update(train_iters=6, profile_step_start=5, profile_step_end=6)
yaml.safe_dump(d, open(sys.argv[2], "w"))
EOF
    python3 -m moetune.cli.main render "$W/moe_proxy18.yaml" --one-gpu --launcher local \
      --out "$W/legacy18" > /dev/null 2>&1
    # the 0.18 wheel alone on the rank's path, as an image holding it would have it
    ( cd "$W/legacy18" && PYTHONPATH=/tmp/mcore18 timeout 200 bash job.sh > run.log 2>&1; echo "rc=$?" >> run.log )
    grep -E "moetune|iteration +6/|rc=|Error" "$W/legacy18/run.log" | tail -6
    mkdir -p "$OUT/cluster"
    cp "$W"/preflight.json "$W"/probe.txt "$W"/preflight_cli.txt "$W"/render.txt "$W"/check18.json "$OUT/cluster/"
    for d in render_cluster render_one_gpu legacy18; do
      mkdir -p "$OUT/cluster/$d"; cp "$W/$d"/job.sh "$W/$d"/job.sbatch "$OUT/cluster/$d/" 2>/dev/null
    done
    tail -c 20000 "$W/legacy18/run.log" > "$OUT/cluster/legacy18_run.log"
    bash benchmarks/device/tune.sh pack
    ;;
  *) echo "usage: $0 first|second" >&2; exit 2 ;;
esac
