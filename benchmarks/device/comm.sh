#!/usr/bin/env bash
# The communication sweep on the GPU machine, in the background so that it outlives a call (a call
# stops at 600 s; the machine stays while calls follow each other within its idle time). From the
# repo root, with .whl, .devlib and .deps (tecarry, the DeepEP archive) carried:
#   bash benchmarks/device/comm.sh start EXPERIMENT NAME ...   # TE and DeepEP built side by side, then
#        the calibration's link probe (calibrate.sh) on 2 GPUs and on every GPU, then each named run
#        of benchmarks/device/comm_sweep.py in the order named (run.sh sweep: every rank under nsys,
#        slimmed and xz'd); NO_PROBE=1 leaves the link probe out (its table is shipped already)
#   bash benchmarks/device/comm.sh wait SECONDS   # until it ends or SECONDS pass; the runs finished
#        since the last call move into $OUT, packed (pack.sh: at most 8 files come back)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=/tmp/moetune-comm; R=$W/out
case "${1:-}" in
  start)
    shift; exp=${1:?experiment}; shift
    mkdir -p "$R/setup" && t0=$SECONDS
    if [ -d .whl ] && ! python3 -c 'import megatron.core' 2>/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
    fi
    OUT=$R/setup bash benchmarks/device_setup.sh te > "$R/setup/te.log" 2>&1 & te=$!
    rdp=skipped  # NO_DEEPEP=1: TE only (a shorter setup; no DeepEP or HybridEP run or probe then)
    if [ -z "${NO_DEEPEP:-}" ]; then
      OUT=$R/setup MAX_JOBS=8 bash benchmarks/device_setup.sh deepep > "$R/setup/deepep.log" 2>&1 & dp=$!
    fi
    wait $te; rte=$?; [ -z "${NO_DEEPEP:-}" ] && { wait $dp; rdp=$?; }
    echo "setup: te exit $rte, deepep exit $rdp, $((SECONDS - t0)) s"; tail -3 "$R/setup/te.log" "$R/setup/deepep.log" 2> /dev/null
    # the code the runs read, copied: the next call lays the checkout anew under them
    rm -rf "$W/code" && mkdir -p "$W/code" && cp -a moetune benchmarks experiments .devlib "$W/code"/ || exit 1
    cd "$W/code" || exit 1
    NO_PROBE=${NO_PROBE:-} setsid nohup bash -c 'R=$1 exp=$2; shift 2
        # the link probe first (a minute; the size curves every rate of the links reads), on 2
        # GPUs and on all of them, then the runs
        n=$(nvidia-smi -L | wc -l)
        [ -n "$NO_PROBE" ] || {
        [ "$n" -gt 2 ] && OUT=$R/calibration2 bash benchmarks/device/calibrate.sh 2 > "$R/calibration2.txt" 2>&1
        OUT=$R/calibration bash benchmarks/device/calibrate.sh "$n" > "$R/calibration.txt" 2>&1; }
        touch "$R/probed"
        OUT=$R bash benchmarks/device/run.sh sweep "$exp" "$@"
        touch "$R/ended"' comm "$R" "$exp" "$@" > "$W/runner.log" 2>&1 < /dev/null &
    echo "runs started: $*"
    ;;
  wait)
    limit=${2:-500}; t0=$SECONDS
    while [ ! -e "$R/ended" ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 5; done
    [ -e "$R/ended" ] && echo "all runs ended" || echo "still running after ${limit}s"
    # a run is finished once run.sh wrote its NAME.json (last)
    for j in "$R"/*.json; do
      [ -e "$j" ] || continue
      n=$(basename "$j" .json); mv "$R/$n".* "$OUT"/
    done
    [ -d "$R/setup" ] && mv "$R/setup" "$OUT"/
    if [ -e "$R/probed" ]; then  # once: the probe's folders leave with the first call after it
      for d in calibration calibration2; do [ -d "$R/$d" ] && mv "$R/$d" "$R/$d.txt" "$OUT"/ 2>/dev/null; done
    fi
    cp "$W/runner.log" "$OUT"/ 2>/dev/null
    (cd "$OUT" && for j in *.json; do [ -e "$j" ] && cat "$j"; done)
    (cd "$OUT" && grep -H -o 'elapsed time per iteration (ms): [0-9.]*' ./*.log 2>/dev/null | awk -F: '{a[$1]=$NF} END {for (k in a) print k, a[k]}')
    [ -f "$OUT/calibration/calibration.log" ] && tail -30 "$OUT/calibration/calibration.log"
    bash benchmarks/device/pack.sh "comm$(date +%H%M)" > /dev/null
    ls -la "$OUT"
    ;;
  *) echo "usage: $0 start EXPERIMENT NAME ... | wait SECONDS"; exit 2 ;;
esac
