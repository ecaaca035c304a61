#!/usr/bin/env bash
# Regenerate the trial bank. On the GPU machine (2 GPUs; carry .whl with megatron-core 0.19.2 and
# .devlib with libdw/libelf for the nsys importer), in calls of at most 10 minutes each:
#   bash benchmarks/device/run.sh bank baseline ep_overlap allgather mbs4 mbs16_oom baseline_1gpu mbs4_1gpu
#   bash benchmarks/device/run.sh bank mbs1 seq4096 manual_gc recompute_mlp ep_overlap_mbs4 tp2_sp_ep2 seq16384_oom manual_gc_1gpu recompute_moe_1gpu
#   bash benchmarks/device/run.sh bank distopt force_balance cuda_graph_attn manual_gc_mbs4 overlap_gc_mbs4 seq4096_1gpu mbs8_1gpu
#   bash benchmarks/device/run.sh bank mbs32_seq4096_oom seq1024 recompute_moe_1gpu seq1024_1gpu
#   bash benchmarks/device_setup.sh deepep && bash benchmarks/device/run.sh bank flex_hybridep flex_deepep
# each followed by `bash benchmarks/device/pack.sh callN`; then here, with the tars unpacked (a later
# folder wins for a name found twice):
#   bash data/trial_bank.sh DIR...
# or, to add or replace some entries and re-analyse the stored traces, keeping the rest:
#   bash data/trial_bank.sh --add DIR...
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" data/trial_bank_build.py "$@" > data/trial_bank/table.md
cat data/trial_bank/table.md
