"""GPU runs whose bottleneck is known by construction, for the analysis' test data.

    torchrun --nproc_per_node=2 benchmarks/scenarios/scenarios.py SCENARIO

Each step is an NVTX range `iteration N`; the profiler's capture range covers steps 3..6, and a
Megatron-style iteration line is printed per step. Scenarios (expected wall):
  a2a_drowned   big all_to_all_single with NCCL P2P/SHM off, little compute     (communication)
  big_gemm      a few large bf16 GEMMs                                             (compute)
  tiny_kernels  thousands of tiny kernels with host work between them           (host_overhead)
  a2a_hidden    all-to-all on a side stream under long GEMMs                    (compute)
  skew          rank 1 sleeps before each all-to-all; rank 0's NCCL kernel waits (host_overhead)
  oom           allocates until CUDA runs out of memory                          (memory)
"""
import os
import sys
import time

import torch
import torch.distributed as dist

STEPS, PROFILE = 8, (3, 6)


def gemm(n, reps):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

    def run():
        for _ in range(reps):
            a @ b
    return run


def a2a(nbytes):
    world = dist.get_world_size()
    n = nbytes // 2 // world * world
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    return lambda: dist.all_to_all_single(y, x)


def scenario(name, rank):
    if name == "a2a_drowned":
        g, c = gemm(2048, 2), a2a(512 << 20)
        return lambda: (g(), c())
    if name == "big_gemm":
        return gemm(8192, 12)
    if name == "tiny_kernels":
        x = torch.zeros(64, device="cuda")

        def run():
            for i in range(3000):
                x.add_(1.0)
                if i % 8 == 0:
                    sum(range(400))  # host work between launches
        return run
    if name == "a2a_hidden":
        g, c = gemm(8192, 16), a2a(64 << 20)
        side = torch.cuda.Stream()

        def run():
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                c()
            g()
            torch.cuda.current_stream().wait_stream(side)
        return run
    if name == "skew":
        g, c = gemm(4096, 4), a2a(32 << 20)

        def run():
            g()
            if rank == 1:
                torch.cuda.synchronize()
                time.sleep(0.05)
            c()
        return run
    if name == "oom":
        held = []

        def run():
            while True:
                held.append(torch.empty(8 << 30, dtype=torch.uint8, device="cuda"))
        return run
    raise SystemExit(f"unknown scenario {name!r}")


def main():
    name = sys.argv[1]
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    step = scenario(name, rank)
    for it in range(1, STEPS + 1):
        if it == PROFILE[0]:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
        torch.cuda.nvtx.range_push(f"iteration {it}")
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.nvtx.range_pop()
        if it == PROFILE[1]:
            torch.cuda.cudart().cudaProfilerStop()
        if rank == 0:
            print(f" iteration {it:8d}/{STEPS:8d} | consumed samples: {it:12d} | "
                  f"elapsed time per iteration (ms): {ms:.1f} | global batch size: 1 |", flush=True)
        dist.barrier()
    if rank == 0:
        mb = torch.cuda.max_memory_allocated() / 2**20
        print(f"[Rank 0] (after {STEPS} iterations) memory (MB) | max allocated: {mb:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
