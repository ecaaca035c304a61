#!/usr/bin/env bash
# Make .deps/tecarry here (git-ignored, about 31 MB; about 40 s): what the GPU machine needs to install
# Transformer Engine 2.20.2 (`bash benchmarks/device_setup.sh te` there, with .deps/tecarry carried).
#   te_core_sm90.tar.xz            the registry's transformer-engine-cu13 core wheel, unpacked, with
#                                  only its sm_90 GPU code kept (benchmarks/device/keep_arch.py)
#   transformer_engine-*.whl       the Python package
#   transformer_engine_torch-*.tar.gz  the PyTorch extension's source, built there with g++
#   cudnn_frontend_headers.tar.xz  nvidia-cudnn-frontend's headers (the build needs them)
#   nvdlfw_inspect, wheel, pydantic and its needs: small Python needs of the above
set -eu
cd "$(dirname "$0")/../.."
V=2.20.2 D=.deps/te K=.deps/tecarry
mkdir -p "$D" "$K"
pip=(python3 -m pip download -q --no-deps --python-version 3.12 --implementation cp -d "$D")
"${pip[@]}" --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  "transformer-engine-cu13==$V" "transformer-engine==$V" nvidia-cudnn-frontend nvdlfw-inspect wheel
# the extension's source: pip reads its metadata by running setup.py, which imports torch, so this
# one is fetched with the megatron venv's Python (scripts/megatron-venv), without build isolation
"${MEGATRON_PY:-.venv-megatron/bin/python}" -m pip download -q --no-deps --no-build-isolation \
  --no-binary=:all: -d "$D" "transformer-engine-torch==$V"
w=$(mktemp -d); trap 'rm -rf "$w"' EXIT
mkdir "$w/core" "$w/cfe"
unzip -q "$D/transformer_engine_cu13-$V-"*.whl -d "$w/core"
for so in "$w"/core/transformer_engine/wheel_lib/*.so; do
  python3 benchmarks/device/keep_arch.py "$so" "$so.kept" 90 && mv "$so.kept" "$so"
done
tar cf - -C "$w/core" . | xz -T0 -6 > "$K/te_core_sm90.tar.xz"
unzip -q "$D"/nvidia_cudnn_frontend-*.whl 'include/*' '*.dist-info/*' -d "$w/cfe"
tar cf - -C "$w/cfe" . | xz -T0 -6 > "$K/cudnn_frontend_headers.tar.xz"
cp "$D/transformer_engine-$V-py3-none-any.whl" "$D/transformer_engine_torch-$V.tar.gz" \
  "$D"/nvdlfw_inspect-*.whl "$D"/wheel-*.whl "$K"/
cp .whl/pydantic-*.whl .whl/pydantic_core-*.whl .whl/annotated_types-*.whl .whl/typing_inspection-*.whl \
  .whl/typing_extensions-*.whl "$K"/  # made as benchmarks/device/tune.sh's header says
du -sh "$K"; ls -l "$K"
