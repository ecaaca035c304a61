#!/usr/bin/env bash
# The kernel probe on the GPU machine (torch only, nothing to build): the GEMM and attention shapes
# of benchmarks/device/kernel_shapes.py's layouts, BF16 and FP8, random data, back to back on a warm
# GPU. From the repo root: `bash benchmarks/device/kernels.sh` leaves $OUT/kernels.json (the table
# to ship as moetune/estimate/kernel_tables/<GPU type>.json) and prints a summary.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
S=benchmarks/device/kernel_shapes.json  # made here by kernel_shapes.py (the image lacks pydantic)
# GEMMs and attention only: the TE layer rows come from layers.sh (TE set up there)
python3 - "$S" /tmp/kernel_shapes.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); s["layers"] = []
json.dump(s, open(sys.argv[2], "w"))
PY
python3 moetune/workloads/kernel_probe.py --shapes /tmp/kernel_shapes.json --out "$OUT/kernels.json" || exit 1
python3 - "$OUT/kernels.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rows = r["rows"]
for d in [x for x in rows if x["kind"] == "data"]:
    print("data", d["fill"], d["tflop_s"])
for dt in ("bf16", "fp8"):
    g = sorted((x for x in rows if x["kind"] == "gemm" and x["dtype"] == dt), key=lambda x: x["tflop_s"])
    if g:
        print(dt, len(g), "shapes; TFLOP/s min", g[0]["tflop_s"], "median", g[len(g) // 2]["tflop_s"], "max", g[-1]["tflop_s"])
a = [x for x in rows if x["kind"] == "attention"]
print("attention", len(a), "shapes; TFLOP/s", sorted(x["tflop_s"] for x in a))
late = [x for x in rows if x.get("host_ahead") is False]
print(len(late), "rows the host did not run ahead of (left out of pricing)")
PY
