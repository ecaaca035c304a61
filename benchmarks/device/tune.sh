#!/usr/bin/env bash
# The device tuning run: `moetune tune moe_proxy --executor local` on the GPU machine, every trial
# a real Megatron training under nsys 2025.3 (submitit's local executor; no Slurm there).
# From the repo root, with .whl and .devlib carried. Made here (both folders are git-ignored):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl megatron-core==0.19.2 submitit pydantic pydantic-core annotated-types typing-inspection \
#     typing-extensions sqlalchemy greenlet
#   .devlib: libdw.so.1 and libelf.so.1 from Debian's libdw1/libelf1 (../shared/device-notes.md)
#   bash benchmarks/device/tune.sh start [--one-gpu] [EXPERIMENT ...]
#                        # the tuner in its own session (outlives the call), one study after another;
#                        # moe_proxy_te and --one-gpu studies: after `device_setup.sh te` (and deepep)
#                        # --one-gpu: `moetune tune EXPERIMENT --one-gpu` (env ITERS, MAX_TRIALS)
#   bash benchmarks/device/tune.sh wait SECONDS         # until it ends or SECONDS pass; packs if it ended
#   bash benchmarks/device/tune.sh pack                 # store, reports, logs, analyses, 2 traces → $OUT
# One-GPU studies need TE (.deps/te1..te3: te_bundle.sh's carry in three parts, joined there as
# .deps/tecarry) and .whl and .devlib in one call; with the trial bank the tracked tree leaves too
# little of a call's 64 MiB, so the 2026-11-23 run went from a local branch without
# data/trial_bank and tests/data (checked out for the device calls only), with
#   mkdir -p .deps/tecarry && cat .deps/te1/* .deps/te2/* .deps/te3/tecore.part.02 > \
#     .deps/tecarry/te_core_sm90.tar.xz && cp .deps/te3/*.whl .deps/te3/*.tar.* .deps/tecarry/
#   bash benchmarks/device_setup.sh te && ITERS=12 MAX_TRIALS=5 bash benchmarks/device/tune.sh \
#     start --one-gpu qwen3_30b_a3b qwen3_235b && bash benchmarks/device/tune.sh wait 470
# The tuner's files live under /tmp/moetune-tune, so a later call on the same warm machine finds them;
# but the machine goes back after 30 s idle, and a first run's files were lost that way: `wait` packs
# into $OUT in the same call as soon as the tuner has ended.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=/opt/nvidia/nsight-compute/2025.3.1/host
W=/tmp/moetune-tune
mkdir -p "$W"

setup() {
  if ! python3 -c 'import megatron.core, submitit, pydantic, sqlalchemy' 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  fi
  # nsys stops at a .qdstrm there; the export stage runs the importer, which needs libdw/libelf
  mkdir -p "$W/devlib" && cp .devlib/* "$W/devlib/"  # the next call re-sends the checkout
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$W/devlib" \
    "$B/linux-desktop-glibc_2_11_3-x64/QdstrmImporter" > "$W/importer"
  chmod +x "$W/importer"
}

# `moetune` is not installed there: a link named moetune to this checkout makes it importable
# (start points it at a copy the tuner runs from; later calls leave it there)
mkdir -p /tmp/moetune-src && { [ -e /tmp/moetune-src/moetune ] || ln -sfn "$PWD/moetune" /tmp/moetune-src/moetune; }
export PYTHONPATH="/tmp/site:/tmp/moetune-src" MOETUNE_QDSTRM_IMPORTER="$W/importer" MOETUNE_NSYS="$B/target-linux-x64/nsys"

case "${1:-}" in
  start)
    shift
    one=""
    if [ "${1:-}" = --one-gpu ]; then one=--one-gpu; shift; fi
    [ $# -gt 0 ] || set -- moe_proxy
    setup
    # the code the tuner and its jobs run, copied: the next call re-sends the checkout under them
    # (a run started from inside it failed at start, benchmarks/device/fit.sh)
    rm -rf /tmp/moetune-code && mkdir -p /tmp/moetune-code &&
      cp -a moetune experiments sbatch_templates benchmarks pyproject.toml /tmp/moetune-code/ || exit 1
    ln -sfn /tmp/moetune-code/moetune /tmp/moetune-src/moetune
    names=()
    for exp in "$@"; do
      name=$(basename "$exp" .yaml); names+=("$name")  # a name under experiments/, or a YAML path
      # the experiment as written, with nsys named by its path on this machine; a one-GPU study
      # also runs its jobs here (venv template, no Slurm, no apex) and profiles rank 0 only, for
      # ITERS iterations (default 30: benchmarks/one_gpu_tuning.py, noise) with the last two profiled
      python3 "$(dirname "$0")/local_experiment.py" "$exp" "$W/$name.yaml" --nsys "$MOETUNE_NSYS" \
        ${one:+--one-gpu "${ITERS:-30}"} || exit 1
    done
    # an experiment whose image has TE needs what device_setup.sh put in /tmp/site-gpu; the
    # TE-less one runs without it, as its trials were recorded
    if python3 -c 'import sys, yaml; sys.exit(not yaml.safe_load(open(sys.argv[1]))["cluster"].get("has_transformer_engine"))' \
        "$W/${names[0]}.yaml"; then
      export PYTHONPATH="/tmp/site-gpu:$PYTHONPATH"
    fi
    date -u +%FT%TZ > "$W/started"
    cd /tmp/moetune-code || exit 1
    setsid nohup bash -c 'W=$1 one=$2; shift 2; for e in "$@"; do
        echo "== $e $one $(date -u +%T)"
        python3 -m moetune.cli.main --db "$W/moetune.db" tune "$W/$e.yaml" $one \
          --executor local --runs "$W/runs" --out "$W/reports" --no-progress ${MAX_TRIALS:+--max-trials $MAX_TRIALS}
      done' tune "$W" "$one" "${names[@]}" > "$W/tune.log" 2>&1 < /dev/null &
    echo $! > "$W/pid"
    echo "tuner started (pid $(cat "$W/pid")): ${names[*]} $one"
    ;;
  wait)
    limit=${2:-500}; t0=$SECONDS
    while kill -0 "$(cat "$W/pid")" 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 5; done
    if kill -0 "$(cat "$W/pid")" 2>/dev/null; then echo "tuner still running after ${limit}s"
    else date -u +%FT%TZ > "$W/ended"; echo "tuner ended"; fi
    tail -5 "$W/tune.log"
    python3 -m moetune.cli.main --db "$W/moetune.db" status 2>&1 | tail -25
    if [ -f "$W/ended" ] && [ ! -e "$OUT/tune.tar.00" ]; then bash "$0" pack > "$W/pack.log" 2>&1; fi
    ;;
  pack)
    d="$OUT/tune"; mkdir -p "$d"
    cp "$W"/moetune.db "$W"/tune.log "$W"/experiment.yaml "$W"/started "$d"/ 2>/dev/null
    cp "$W"/ended "$d"/ 2>/dev/null
    cp -r "$W/reports" "$d"/ 2>/dev/null
    # every trial's small files; the traces of the first and the best trial, slimmed and xz'd
    for t in "$W"/runs/*/*/; do
      n=$(basename "$t"); mkdir -p "$d/runs/$n"
      find "$t" -maxdepth 1 -type f \( -name '*.json' -o -name '*.txt' -o -name '*.sh' -o -name '*.md' \) \
        -size -4M -exec cp {} "$d/runs/$n/" \;
      if [ -d "$t/fit" ]; then  # the fit: its verdict and each rank's log
        mkdir -p "$d/runs/$n/fit"; cp "$t"/fit/*.json "$t"/fit/log_rank_*.txt "$d/runs/$n/fit/" 2>/dev/null
      fi
    done
    python3 - "$W" "$d" <<'EOF'
import json, pathlib, subprocess, sys
w, d = map(pathlib.Path, sys.argv[1:])
trials = sorted((p for p in (w / "runs").glob("*/*") if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
step = {}
for t in trials:
    try:
        step[t] = json.loads((t / "analysis.json").read_text())["metrics"]["combined"]["step_time_ms"]
    except Exception:
        pass
keep = set(trials[:1]) | ({min(step, key=step.get)} if step else set())
keep |= {t for t in step if t.parent.name.endswith("-1gpu")}  # one-GPU studies: every trace
for t in keep:
    # NVIDIA's recipe tables beside the report (moetune/analysis/recipes.py), kept for the agreement tests
    for f in t.glob("recipes_trace_*/*/*"):
        if f.suffix in (".parquet", ".log") and f.stat().st_size < 2_000_000:
            dest = d / "runs" / t.name / f.parent.parent.name / f.parent.name
            dest.mkdir(parents=True, exist_ok=True)
            (dest / f.name).write_bytes(f.read_bytes())
    for s in t.glob("trace_*.sqlite"):
        out = d / "runs" / t.name / s.name
        subprocess.run([sys.executable, "benchmarks/slim_trace.py", str(s), str(out)], check=False)
        subprocess.run(["xz", "-9", "-T0", "-f", str(out)], check=False)
EOF
    du -sh "$d"; bash benchmarks/device/pack.sh tune
    ;;
  *) echo "usage: $0 start [EXPERIMENT] | wait SECONDS | pack"; exit 2 ;;
esac
