#!/usr/bin/env bash
# The preflight's probe on the GPU machine (no Slurm there): what a trial meets on it (GPUs and
# their memory, driver and CUDA, torch, Transformer Engine, apex, DeepEP with HybridEP and NVSHMEM,
# the driver settings IBGDA needs, nsys 2025.3 and `nsys recipe`, CPUs, NUMA nodes, InfiniBand,
# Megatron through train_moe.py --moetune-check), printed and left in $OUT/preflight.json.
# From the repo root:
#   bash benchmarks/device/preflight.sh probe   # the probe alone, by python3 (nothing to carry;
#                                               # Megatron found only where it is installed there)
#   bash benchmarks/device/preflight.sh cli     # `moetune preflight moe_proxy --executor local`:
#                                               # the job as the tuner submits it (submitit's local
#                                               # executor), judged and tabled; carry .whl as
#                                               # benchmarks/device/tune.sh's header says
# After `benchmarks/device_setup.sh te deepep` in the same call, TE and DeepEP show up too.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=/opt/nvidia/nsight-compute/2025.3.1/host
NSYS=${NSYS:-$B/target-linux-x64/nsys}
[ -x "$NSYS" ] || NSYS=nsys
W=/tmp/moetune-preflight
mkdir -p "$W"

case "${1:-probe}" in
  probe)
    # the login side's token, read back by the probe through the same path (one machine here)
    head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$W/token"
    python3 moetune/workloads/preflight_probe.py --out "$OUT/preflight.json" --token-file "$W/token" \
      --nsys "$NSYS" > "$W/probe.out" 2> "$W/probe.err"
    rc=$?
    tail -n 5 "$W/probe.err"
    python3 -m json.tool --sort-keys "$OUT/preflight.json"
    echo "token written: $(cat "$W/token")"
    exit "$rc" ;;
  cli)
    if ! python3 -c 'import submitit, pydantic, sqlalchemy, yaml, jinja2' 2>/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    fi
    # `moetune` is not installed there: a link named moetune to this checkout makes it importable
    mkdir -p "$W/src" && ln -sfn "$PWD/moetune" "$W/src/moetune"
    export PYTHONPATH="/tmp/site:$W/src:${PYTHONPATH:-}"
    # the cluster section as the device runs it: local executor, venv template, nsys 2025.3
    python3 - experiments/moe_proxy.yaml "$W/moe_proxy.yaml" "$NSYS" <<'EOF'
import sys, yaml
src, p, nsys = sys.argv[1:]
exp = yaml.safe_load(open(src))
exp["cluster"].update(template="venv", executor="local", nsys=nsys, python="python3")
yaml.safe_dump(exp, open(p, "w"))
EOF
    python3 -m moetune.cli.main --db "$W/db.sqlite" preflight "$W/moe_proxy.yaml" \
      --executor local --runs "$W/runs" | tee "$OUT/preflight.txt"
    rc=${PIPESTATUS[0]}
    cp "$W"/runs/_preflight/*/outcome.json "$OUT/" 2>/dev/null
    exit "$rc" ;;
  *) echo "usage: $0 probe|cli" >&2; exit 2 ;;
esac
