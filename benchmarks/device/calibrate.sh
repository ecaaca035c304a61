#!/usr/bin/env bash
# The calibration's probe (moetune/workloads/link_probe.py) on the GPU machine, no Slurm there: one rank
# a GPU through torchrun, NCCL; with one GPU the copy rates (host to device, device to host, device
# to device) and a BF16 GEMM, with two or more also the collectives inside the node and DeepEP's
# dispatch and combine where it imports (after `benchmarks/device_setup.sh deepep` in the same call:
# /tmp/site-gpu is on the path). Leaves $OUT/calibration.json (the record `moetune calibrate` stores)
# and $OUT/calibration.log. From the repo root:
#   bash benchmarks/device/calibrate.sh [NPROC]          # default: every GPU there
#   bash benchmarks/device/calibrate.sh [NPROC] MODEL    # then `moetune calibrate MODEL --executor
#                                                        # local` (carry .whl as benchmarks/device/
#                                                        # tune.sh says): the job, stored, and what
#                                                        # `moetune predict MODEL` makes of it
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
NPROC=${1:-$(nvidia-smi -L 2> /dev/null | wc -l)}
[ "$NPROC" -ge 1 ] 2> /dev/null || NPROC=1
MODEL=${2:-}
W=/tmp/moetune-calibrate; mkdir -p "$W"
export PYTHONPATH="/tmp/site-gpu:${PYTHONPATH:-}"

t0=$SECONDS
"$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" moetune/workloads/link_probe.py \
  --out "$OUT/calibration.json" --iters "${ITERS:-20}" ${SIZES:+--sizes "$SIZES"} > "$OUT/calibration.log" 2>&1
rc=$?
echo "probe: $NPROC rank(s), exit $rc, $((SECONDS - t0)) s"
[ "$rc" -eq 0 ] || { tail -n 20 "$OUT/calibration.log"; exit "$rc"; }
"$PYTHON" moetune/workloads/link_probe.py --show "$OUT/calibration.json"
[ -n "$MODEL" ] || exit 0

if ! "$PYTHON" -c 'import submitit, pydantic, sqlalchemy, yaml, jinja2' 2> /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
# `moetune` is not installed there: a link named moetune to this checkout makes it importable
mkdir -p "$W/src" && ln -sfn "$PWD/moetune" "$W/src/moetune"
export PYTHONPATH="/tmp/site:$W/src:$PYTHONPATH"
# the real path: moetune calibrate renders the job, submitit's local executor runs it, the record is
# read back from the job's files and stored; then predict reads it from the store
MT=("$PYTHON" -m moetune.cli.main --db "$W/db.sqlite")
# the experiment as written, its job run here: the venv template (no Slurm, no container); the
# cluster keeps its name, so predict of the shipped experiment finds the calibration
"$PYTHON" "$(dirname "$0")/local_experiment.py" "$MODEL" "$W/experiment.yaml" --local || exit 1
"${MT[@]}" calibrate "$W/experiment.yaml" --executor local --nodes 1 --gpus "$NPROC" --runs "$W/runs" | tee "$OUT/calibrate.txt"
rc=${PIPESTATUS[0]}
cp -r "$W/runs/_calibrate" "$OUT/calibrate_job" 2> /dev/null
[ "$rc" -eq 0 ] || exit "$rc"
"${MT[@]}" predict "$MODEL" | tee "$OUT/predict.txt"
"${MT[@]}" predict "$MODEL" --format json > "$OUT/predict.json"
