#!/usr/bin/env bash
# On the GPU machine (nsys 2025.3 with `nsys recipe`): profile benchmarks/device/recipe_workload.py,
# import and export its report to SQLite, and run NVIDIA's recipes on it; everything to $OUT
# (recipe outputs, the SQLite as xz). Carry .devlib (libdw, libelf for QdstrmImporter; see
# ../shared/device-notes.md). From the repo root:  [RANKS=2] bash benchmarks/device/recipes.sh [--nccl]
# (RANKS > 1: torchrun starts that many ranks, one GPU each, and NCCL launches its kernels)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=/opt/nvidia/nsight-compute/2025.3.1/host
N=$B/target-linux-x64/nsys
Q=$B/linux-desktop-glibc_2_11_3-x64/QdstrmImporter
W=/tmp/recipes; rm -rf "$W"; mkdir -p "$W"
t0=$SECONDS
"$N" profile -t cuda,nvtx -s none --cpuctxsw=none -o "$W/run" --force-overwrite true \
  python3 $([ "${RANKS:-1}" -gt 1 ] && echo "-m torch.distributed.run --nproc_per_node=$RANKS") \
  benchmarks/device/recipe_workload.py "$@" > "$OUT/profile.log" 2>&1
[ -f "$W/run.nsys-rep" ] || LD_LIBRARY_PATH=$PWD/.devlib "$Q" -i "$W/run.qdstrm" >> "$OUT/profile.log" 2>&1
"$N" export --type sqlite -o "$W/run.sqlite" --force-overwrite true "$W/run.nsys-rep" >> "$OUT/profile.log" 2>&1
echo "profile+export: $((SECONDS - t0)) s"
for r in cuda_gpu_kern_sum gpu_time_util cuda_gpu_time_util_map gpu_gaps nvtx_gpu_proj_sum \
         nccl_gpu_overlap_trace nccl_sum; do
  t1=$SECONDS
  "$N" recipe "$r" --input "$W/run.nsys-rep" --output "$W/$r" > "$W/$r.log" 2>&1
  echo "$r: rc $? in $((SECONDS - t1)) s"
  mkdir -p "$OUT/$r"
  find "$W/$r" -maxdepth 2 -type f \( -name '*.parquet' -o -name '*.csv' -o -name '*.json' \) \
    -exec cp {} "$OUT/$r/" \; 2>/dev/null
  cp "$W/$r.log" "$OUT/$r/recipe.log"
done
xz -T0 -6 -c "$W/run.sqlite" > "$OUT/run.sqlite.xz"
"$N" --version
ls -la "$OUT" "$OUT"/*/ | head -60
