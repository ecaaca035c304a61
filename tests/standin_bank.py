"""A CPU stand-in for the GPU trial bank (data/trial_bank), for tests and for the tuning
benchmark before the real bank is in the checkout.

It holds the bank's own configs (benchmarks/device/bank_configs.py) with made-up step times from
a small cost model below, and for each a Megatron-format log and a hand-built Nsight Systems
SQLite trace (tests/nsys_fixture.py) of 2 ranks x 3 steps whose kernels match that cost model:
compute, exposed NCCL SendRecv all-to-all, all-to-all hidden under compute, and idle gaps. The
analysis that the loop reads comes from these files through the real `analysis.analyze`.
Nothing here was measured on a GPU.
"""
from __future__ import annotations

import hashlib
import json
import lzma
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from nsys_fixture import PID, TraceBuilder  # noqa: E402

# cost model of one step (ms) by change: (compute, exposed a2a, hidden a2a, idle)
BASE_STEP = {"compute": 300.0, "a2a": 70.0, "hidden": 0.0, "idle": 130.0}


def cost(changes: dict) -> dict | str:
    """Step parts of a config, or the failure it ends in."""
    c = dict(BASE_STEP)
    if changes.get("seq_length", 0) >= 16384 or changes.get("micro_batch", 0) >= 16:
        return "OUT_OF_MEMORY"
    if changes.get("cuda_graph_impl", "none") != "none":
        return "FAILED"
    mbs = changes.get("micro_batch", 2)
    c["idle"] *= {1: 1.8, 2: 1.0, 4: 0.45, 8: 0.35}.get(mbs, 1.0)
    c["compute"] *= {1: 1.05, 2: 1.0, 4: 0.97, 8: 0.96}.get(mbs, 1.0)
    if changes.get("dispatcher") == "allgather":
        c["a2a"] *= 1.5
    if changes.get("overlap_ep_a2a"):
        c["hidden"], c["a2a"] = c["a2a"] * 0.7, c["a2a"] * 0.3
        c["compute"] *= 1.02
    if changes.get("manual_gc"):
        c["idle"] *= 0.8
    if changes.get("recompute_granularity"):
        c["compute"] *= 1.3 if changes["recompute_granularity"] == "full" else 1.12
    if changes.get("distributed_optimizer"):
        c["compute"] *= 0.995
    if changes.get("overlap_grad_reduce"):
        c["idle"] *= 0.97
    if changes.get("tp", 1) > 1:
        c["compute"] *= 1.15
    if changes.get("ep") == 1:
        c["a2a"], c["compute"] = 0.0, c["compute"] * 1.25
    if changes.get("force_balance"):
        c["compute"] *= 0.97
    if "seq_length" in changes:
        f = changes["seq_length"] / 2048
        c = {k: v * f for k, v in c.items()}
    return c


def _jitter(name: str, i: int) -> float:
    h = hashlib.sha256(f"{name}:{i}".encode()).digest()
    return (h[0] / 255.0 - 0.5) * 0.01  # +-0.5%


def write_trace(path: Path, name: str, c: dict, steps: int = 3, sendrecv_name="ncclDevKernel_SendRecv",
                extra_kernels: tuple = ()) -> Path:
    """2 ranks (one process each) x `steps` steps of the cost model, with NVTX step ranges."""
    tb = TraceBuilder(gpu_memory_gb=141)
    for rank in range(2):
        pid = PID + (rank << 24)
        t = 1000.0
        for s in range(steps):
            step_us = sum(v for k, v in c.items() if k != "hidden") * 1000 * (1 + _jitter(name, s))
            scale = step_us / (sum(v for k, v in c.items() if k != "hidden") * 1000)
            tb.range(f"iteration {s + 6}", t, t + step_us, pid=pid)
            chunk = {k: v * 1000 * scale / 4 for k, v in c.items()}
            for _ in range(4):
                g = chunk["compute"]
                tb.kernel("nvjet_sm90_tst_128x256_gemm", t, t + g / 2, device=rank, pid=pid,
                          launch_us=(t - 5, t - 2))
                tb.kernel("vectorized_elementwise_kernel", t + g / 2, t + g, device=rank, pid=pid,
                          launch_us=(t + g / 2 - 5, t + g / 2 - 2))
                if chunk["hidden"]:
                    tb.kernel(sendrecv_name, t + 1, t + 1 + min(chunk["hidden"], g - 2),
                              device=rank, stream=9, pid=pid)
                for kname in extra_kernels:
                    tb.kernel(kname, t + 1, t + 3, device=rank, stream=11, pid=pid)
                t += g
                if chunk["a2a"]:
                    tb.kernel(sendrecv_name, t, t + chunk["a2a"], device=rank, stream=8, pid=pid)
                    t += chunk["a2a"]
                t += chunk["idle"]
            # idle time is a gap: the next step's first launch is late
    return tb.write(path)


def write_log(path: Path, c: dict | str, name: str, iters: int = 10) -> Path:
    lines = ["using world size: 2, data-parallel size: 1, tensor-model-parallel size: 1",
             "[before the start of training step] datetime: 2026-11-22 21:00:00"]
    if c == "OUT_OF_MEMORY":
        lines += ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    elif c == "FAILED":
        lines += ["RuntimeError: CUDA error: operation not permitted when stream is capturing"]
    else:
        step = sum(v for k, v in c.items() if k != "hidden")
        for i in range(1, iters + 1):
            ms = step * (1.3 if i <= 2 else 1 + _jitter(name, 100 + i))
            tflops = 40.0 * 500.0 / ms
            lines.append(f" [2026-11-22 21:00:{i:02d}] iteration {i:8d}/{iters:8d} | consumed samples: "
                         f"{16 * i:10d} | elapsed time per iteration (ms): {ms:.1f} | throughput per "
                         f"GPU (TFLOP/s/GPU): {tflops:.1f} | learning rate: 1.0E-04 | "
                         f"lm loss: 1.0E+01 | loss scale: 1.0 | grad norm: 1.000 |")
            if i == 1:
                lines.append("[Rank 0] (after 1 iterations) memory (MB) | allocated: 9000.0 | "
                             "max allocated: 21000.0 | reserved: 24000.0 | max reserved: 24000.0")
    path.write_text("\n".join(lines) + "\n")
    return path


def build(bank_dir: Path, configs=None, slower=None, no_effect=(), hang=()) -> Path:
    """Write a stand-in bank.jsonl (+ xz logs and traces) under `bank_dir`; returns the jsonl.

    slower: {name: factor} on that entry's compute; no_effect: entries whose EP overlap hides
    nothing (a silent fallback); hang: entries whose log ends in an NCCL watchdog timeout."""
    sys.path.insert(0, str(REPO / "benchmarks" / "device"))
    import bank_configs as bc
    bank_dir = Path(bank_dir)
    (bank_dir / "trials").mkdir(parents=True, exist_ok=True)
    rows = []
    for name, changes in configs or bc.CONFIGS:
        if name.endswith("_1gpu"):
            continue
        cfg = bc.BASE.replace(**changes)
        c = cost({k: v for k, v in changes.items()
                  if not (name in no_effect and k == "overlap_ep_a2a")})
        if name in (slower or {}) and not isinstance(c, str):
            c["compute"] *= slower[name]
        state = c if isinstance(c, str) else "COMPLETED"
        log = write_log(bank_dir / "trials" / f"{name}.log", c, name)
        if name in hang:
            state = "FAILED"
            log.write_text(log.read_text().splitlines()[3] + "\n[rank1]:[E ProcessGroupNCCL.cpp:616]"
                           " [Rank 1] Watchdog caught collective operation timeout: "
                           "WorkNCCL(SeqNum=812, OpType=ALLTOALL_BASE) ran for 600000 ms\n")
        trace = None
        if state == "COMPLETED":
            trace = write_trace(bank_dir / "trials" / f"{name}.sqlite", name, c)
        entry = {"name": name, "args": bc.argv(changes), "config": cfg.to_dict(), "state": state,
                 "step_time_ms": None, "step_time_std_ms": None, "tflops_per_gpu": None,
                 "peak_memory_gb": None, "log": _xz(log), "trace": _xz(trace) if trace else None,
                 "analysis": None, "stand_in": True}
        if state == "COMPLETED":
            entry["step_time_ms"] = round(sum(v for k, v in c.items() if k != "hidden"), 3)
        rows.append(entry)
    out = bank_dir / "bank.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _xz(path: Path) -> str:
    dst = path.with_name(path.name + ".xz")
    dst.write_bytes(lzma.compress(path.read_bytes()))
    path.unlink()
    return str(dst.relative_to(dst.parents[1]))


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
