"""A small GPU workload for checking moetune's trace metrics against NVIDIA's recipes: a few
iterations of GEMMs, element-wise kernels, a reduction and idle gaps of known length (a sleep on the
host between launches), each iteration an NVTX range `iteration N` as Megatron's are. Runs on one
GPU with plain PyTorch (no Megatron). `--nccl`: each iteration also all-reduces a buffer through
NCCL on a side stream, beside the GEMMs, so that communication overlaps compute for part of its
time: in a one-rank process group (NCCL then launches no kernel), or, started by torchrun, across
its ranks. Each rank prints the GPU memory NCCL holds outside PyTorch's allocator (what a fit under
the fake process group never allocates: experiment/fit.py NCCL_BUFFERS_GB)."""
import os
import sys
import time

import torch

ITERS = 8


def main() -> None:
    nccl = "--nccl" in sys.argv
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    if nccl:
        import torch.distributed as dist
        if "WORLD_SIZE" not in os.environ:  # not under torchrun: a one-rank group
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", RANK="0", WORLD_SIZE="1")
        torch.zeros(1, device=dev)  # the CUDA context first, so the figure below is NCCL's alone
        free0 = torch.cuda.mem_get_info(dev)[0]
        dist.init_process_group("nccl", device_id=dev)
        buf = torch.randn(64 * 2**20, device=dev)
        side = torch.cuda.Stream()
        dist.all_reduce(buf)
        a2a_in = torch.randn(16 * 2**20, device=dev)
        dist.all_to_all_single(torch.empty_like(a2a_in), a2a_in)
        torch.cuda.synchronize()
        outside = free0 - torch.cuda.mem_get_info(dev)[0] - torch.cuda.memory_reserved(dev)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()}: NCCL holds {outside / 2**20:.0f} MiB "
              "outside PyTorch's allocator (after an all-reduce and an all-to-all)", flush=True)
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    for _ in range(3):  # warm-up outside the ranges (cuBLAS handles, allocator)
        (a @ b).float().sum()
    torch.cuda.synchronize()
    for it in range(1, ITERS + 1):
        torch.cuda.nvtx.range_push(f"iteration {it}")
        if nccl:  # the all-reduce runs on its own stream while the GEMM and element-wise run
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                dist.all_reduce(buf)
        c = a @ b
        for _ in range(20):  # short kernels, launch-bound
            c = torch.nn.functional.gelu(c) * 0.5
        torch.cuda.synchronize()
        time.sleep(0.005)  # an idle gap of 5 ms the busy share must leave out
        d = (c.float() @ b.float()).sum()
        d.item()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    if nccl:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
