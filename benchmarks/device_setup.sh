#!/usr/bin/env bash
# Build what the TE-less GPU image lacks, on the GPU machine, from the repo root:
#   bash benchmarks/device_setup.sh deepep
# deepep: DeepEP from its `hybrid-ep` branch (both `deep_ep.Buffer` and `deep_ep.HybridEPBuffer`,
#   the two flex-dispatcher backends Megatron-Core imports), carried as .deps/deepep-hybrid-ep.tar.gz
#   (`git archive hybrid-ep` of github.com/deepseek-ai/DeepEP). Built for sm_90 only, against the
#   machine's torch, CUDA 13, NCCL and NVSHMEM (pip wheels). The wheel is cached
#   in /tmp/moetune-deps (a later call on the same warm machine skips the build), installed into
#   /tmp/site and copied to $OUT so it can be carried instead of rebuilt.
# Prints how long each part took.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
C=/tmp/moetune-deps; mkdir -p "$C"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"

deepep() {
  local t0=$SECONDS wheel
  wheel=$(ls "$C"/deep_ep-*.whl .deps/deep_ep-*.whl 2>/dev/null | head -n 1)
  if [ -z "$wheel" ]; then
    rm -rf "$C/src" && mkdir -p "$C/src" && tar xzf .deps/deepep-hybrid-ep.tar.gz -C "$C/src" || return 1
    cd "$C/src/DeepEP" || return 1
    # NVSHMEM comes from the machine's nvidia-nvshmem-cu13 wheel. Built without it, Megatron's
    # buffer sizing (Config.get_rdma_buffer_size_hint) stops: "NVSHMEM is disable during compilation".
    # HybridEP links nvtx3interop; NVTX 3 is header-only, so drop the library where CUDA lacks it
    ls "$CUDA_HOME"/lib64/libnvtx3interop.so* > /dev/null 2>&1 || sed -i 's/, "nvtx3interop"//' setup.py
    # NVSHMEM 3.4's headers include <cuda/std/tuple>, which CUDA 13 keeps under include/cccl;
    # nvcc looks there by itself, g++ (deep_ep.cpp) only through CPATH
    CPATH="$CUDA_HOME/include/cccl${CPATH:+:$CPATH}" \
    TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-8} python3 -m pip wheel -q --no-build-isolation \
      --no-deps -w "$C" . > "$C/build.log" 2>&1
    local rc=$?
    cd - > /dev/null
    if [ $rc != 0 ]; then
      echo "deepep: build failed (rc $rc) after $((SECONDS - t0)) s; last lines:"; tail -25 "$C/build.log"
      cp "$C/build.log" "$OUT/deepep-build.log"; return 1
    fi
    wheel=$(ls "$C"/deep_ep-*.whl | head -n 1)
    echo "deepep: built $(basename "$wheel") in $((SECONDS - t0)) s"
  else
    echo "deepep: cached $(basename "$wheel")"
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel" || return 1
  PYTHONPATH=/tmp/site python3 -c 'import torch, deep_ep; print("deepep: import ok", deep_ep.Buffer.__name__, deep_ep.HybridEPBuffer.__name__)' || return 1
  cp "$wheel" "$OUT"/
}

case "${1:-}" in
  deepep) deepep ;;
  *) echo "usage: $0 deepep"; exit 2 ;;
esac
