#!/usr/bin/env bash
# Build what the TE-less GPU image lacks, on the GPU machine, from the repo root:
#   bash benchmarks/device_setup.sh deepep te
# deepep: DeepEP from its `hybrid-ep` branch (both `deep_ep.Buffer` and `deep_ep.HybridEPBuffer`,
#   the two flex-dispatcher backends Megatron-Core imports), carried as .deps/deepep-hybrid-ep.tar.gz
#   (`git archive hybrid-ep` of github.com/deepseek-ai/DeepEP). Built for sm_90 only, against the
#   machine's torch, CUDA 13, NCCL and NVSHMEM (pip wheels). The wheel is cached
#   in /tmp/moetune-deps (a later call on the same warm machine skips the build), installed into
#   /tmp/site-gpu and copied to $OUT so it can be carried (as .deps/deep_ep-*.whl) instead of rebuilt.
#   The check after the install asks for the RDMA buffer size, which a build without NVSHMEM refuses
#   (a carried wheel built without it ran te_gg_deepep into "NVSHMEM is disable during compilation").
# te: Transformer Engine 2.20.2 into /tmp/site-gpu (not /tmp/site, so the TE-less tuning run stays TE-less;
#   benchmarks/device/run.sh puts it on PYTHONPATH). Carry .deps/tecarry, made here by
#   benchmarks/device/te_bundle.sh: the registry's CUDA 13 core with only its sm_90 code kept, and
#   the PyTorch extension's source, built there with g++ against the machine's torch. The
#   extension's wheel is cached in /tmp/moetune-deps and copied to $OUT.
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
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-gpu "$wheel" || return 1
  PYTHONPATH=/tmp/site-gpu:/tmp/site python3 -c 'import torch, deep_ep
print("deepep: import ok", deep_ep.Buffer.__name__, deep_ep.HybridEPBuffer.__name__,
      "rdma hint", deep_ep.Config(20, 8, 256, 6, 128).get_rdma_buffer_size_hint(2048, 2))' || return 1
  cp "$wheel" "$OUT"/
}

te() {
  local t0=$SECONDS S=/tmp/site-gpu K=.deps/tecarry wheel nv rc
  if PYTHONPATH="$S:/tmp/site" python3 -c 'import transformer_engine.pytorch' 2>/dev/null; then
    echo "te: cached in $S"; return 0
  fi
  mkdir -p "$S" || return 1
  tar xJf "$K/te_core_sm90.tar.xz" -C "$S" && tar xJf "$K/cudnn_frontend_headers.tar.xz" -C "$S" &&
    for w in "$K"/transformer_engine-*.whl "$K"/nvdlfw_inspect-*.whl "$K"/wheel-*.whl; do
      python3 -m zipfile -e "$w" "$S" || return 1  # unzip: pip --target skips folders that exist
    done
  echo "te: core unpacked in $((SECONDS - t0)) s"
  wheel=$(ls "$C"/transformer_engine_torch-*.whl "$K"/transformer_engine_torch-*.whl 2>/dev/null | head -n 1)
  if [ -z "$wheel" ]; then
    t0=$SECONDS
    rm -rf "$C/te-src" && mkdir -p "$C/te-src" && tar xzf "$K"/transformer_engine_torch-*.tar.gz -C "$C/te-src" || return 1
    # nccl.h and cudnn.h come from the machine's nvidia-nccl/nvidia-cudnn wheels, not CUDA's folder
    nv=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')
    (cd "$C"/te-src/transformer_engine_torch-* &&
      CPATH="$nv/nccl/include:$nv/cudnn/include${CPATH:+:$CPATH}" PYTHONPATH="$S:${PYTHONPATH:-}" \
      NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-32} python3 -m pip wheel -q --no-build-isolation \
        --no-deps --no-index -w "$C" . > "$C/te-build.log" 2>&1)
    rc=$?
    if [ $rc != 0 ]; then
      echo "te: extension build failed (rc $rc) after $((SECONDS - t0)) s; first errors:"
      grep -m 8 -E 'error|Error' "$C/te-build.log"; cp "$C/te-build.log" "$OUT/te-build.log"; return 1
    fi
    wheel=$(ls "$C"/transformer_engine_torch-*.whl | head -n 1)
    echo "te: built $(basename "$wheel") in $((SECONDS - t0)) s"
    cp "$wheel" "$OUT"/
  fi
  python3 -m zipfile -e "$wheel" "$S" || return 1
  # TE's recipes need pydantic, which the image lacks (also in .whl, for Megatron's side)
  python3 -c 'import pydantic' 2>/dev/null || PYTHONPATH=/tmp/site python3 -c 'import pydantic' 2>/dev/null ||
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$K"/pydantic*.whl \
      "$K"/annotated_types-*.whl "$K"/typing_inspection-*.whl "$K"/typing_extensions-*.whl || return 1
  PYTHONPATH="$S:/tmp/site" python3 benchmarks/device/te_check.py
}

case "${1:-}" in
  deepep|te) for part in "$@"; do "$part" || exit 1; done ;;
  *) echo "usage: $0 deepep|te ..."; exit 2 ;;
esac
