#!/usr/bin/env bash
# TE layers under each FP8 recipe, and attention at the lengths the table lacks, on the GPU machine: the rows the
# kernel table adds to its GEMMs (moetune/workloads/kernel_probe.py; shapes from
# `kernel_shapes.py benchmarks/device/layer_shapes.json --only layers,attention`). With .deps/tecarry
# carried, from the repo root:
#   bash benchmarks/device/layers.sh start     # TE setup, then one probe a recipe in the background
#   bash benchmarks/device/layers.sh wait S    # until they end or S seconds pass; packs into $OUT
# PARTS="attention bf16 ..." picks the parts (default all); the attention part times only the shapes
# the shipped table (moetune/estimate/kernel_tables/H200.json) lacks.
set -u
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/layers; S=benchmarks/device/layer_shapes.json
PARTS=${PARTS:-attention bf16 tensorwise blockwise delayed}

start() {
  nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
  bash benchmarks/device_setup.sh te || exit 1
  cp .deps/tecarry/transformer_engine_torch-*.whl "$OUT"/ 2>/dev/null || cp /tmp/moetune-deps/transformer_engine_torch-*.whl "$OUT"/
  rm -rf "$W" && mkdir -p "$W" && echo "$PARTS" > "$W/parts.txt" && : > "$W/done.txt" && cp moetune/workloads/kernel_probe.py "$S" moetune/estimate/kernel_tables/H200.json "$W"/
  # one GPU: the parts run one after another, each its own record, so a cut-off call keeps what ended
  setsid bash -c '
    cd '"$W"'
    for part in '"$PARTS"'; do
      python3 - "$part" <<PY
import json, sys
s = json.load(open("layer_shapes.json")); part = sys.argv[1]
if part == "attention":
    have = {tuple(r[k] for k in ("batch", "seq", "heads", "groups", "dim"))
            for r in json.load(open("H200.json"))["rows"] if r["kind"] == "attention"}
    s.update(layers=[], gemm=[], attention=[a for a in s["attention"] if tuple(a) not in have])
else:
    s.update(attention=[], gemm=[], recipes=[part])
json.dump(s, open(f"shapes_{part}.json", "w"))
PY
      PYTHONPATH=/tmp/site-gpu:/tmp/site timeout 900 python3 kernel_probe.py --shapes "shapes_$part.json" \
        --out "rows_$part.json" --min-ms 20 > "$part.log" 2>&1
      echo "$part rc $?" >> done.txt
    done' > /dev/null 2>&1 < /dev/null &
  echo "started: $PARTS"
}

wait_for() {
  local until=$((SECONDS + $1)) parts
  parts=$(wc -w < "$W/parts.txt") || return 1  # what `start` began
  while [ $SECONDS -lt $until ] && [ "$(wc -l < "$W/done.txt")" -lt "$parts" ]; do sleep 5; done
  cp "$W"/rows_*.json "$W"/*.log "$W"/done.txt "$OUT"/ 2>/dev/null
  cat "$W/done.txt" 2>/dev/null; tail -n 2 "$W"/*.log
  python3 - "$W" <<'PY'
import glob, json, statistics, sys
for f in sorted(glob.glob(sys.argv[1] + "/rows_*.json")):
    rows = [r for r in json.load(open(f))["rows"] if r["kind"] in ("layer", "attention")]
    bad = [r for r in rows if r.get("error")]
    late = [r for r in rows if r.get("host_ahead") is False]
    print(f.split("/")[-1], len(rows), "rows", len(bad), "errors", len(late), "host not ahead",
          bad[0]["error"] if bad else "")
PY
}

case "${1:-}" in
  start) start ;;
  wait) wait_for "${2:-500}" ;;
  *) echo "usage: layers.sh start | wait SECONDS" >&2; exit 2 ;;
esac
