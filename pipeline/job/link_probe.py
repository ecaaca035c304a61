"""The calibration's probe: the cluster's links and one GPU's rates, measured, as one JSON record
of rows.

Runs inside the job by its path, in the trials' image, one process a rank (torch only, no moetune
there): the rendezvous from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (what the job
script or torchrun sets; alone, one rank here). NCCL on GPUs, gloo on CPU.

    python link_probe.py --out FILE [--sizes BYTES,...] [--iters N] [--backend auto|nccl|gloo]

Rows (rank 0 writes them):
- collective: all_to_all, all_gather, reduce_scatter, all_reduce of each size over each group
  shape: `node` (a node's ranks), `across` (one rank of each node), `world` (all, where that is a
  third shape); every group of a shape runs at once, and a row's time is the slowest rank's mean.
  `bytes` is the whole tensor (all-gather's output, reduce-scatter's input, a rank's all-to-all
  send buffer); bus bandwidth as nccl-tests counts it.
- copy: host to device (pinned), device to host, device to device; gemm: a BF16 matrix product
  (GPU) or FP32 (CPU); deep_ep: DeepEP's dispatch and combine inside a node where the image has it.
What could not be measured is listed under `skipped` with the reason.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import warnings

MARKER = "MOETUNE_CALIBRATION "
OPS = ("all_to_all", "all_gather", "reduce_scatter", "all_reduce")
# nccl-tests' bus bandwidth: algorithm bandwidth x this factor of the group size n
BUS_FACTOR = {"all_to_all": lambda n: (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_reduce": lambda n: 2 * (n - 1) / n}
DEFAULT_SIZES = (4096, 1 << 20, 16 << 20, 128 << 20)
GEMM_N = {"cuda": 8192, "cpu": 1024}
COPY_BYTES = 256 << 20


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def shapes(nodes: list[str]) -> dict[str, list[list[int]]]:
    """{shape: its groups (rank lists)} from each rank's node; a shape with groups of one rank, or
    one that equals another, is left out."""
    by_node: dict[str, list[int]] = {}
    for rank, n in enumerate(nodes):
        by_node.setdefault(n, []).append(rank)
    per_node = [by_node[n] for n in sorted(by_node, key=lambda n: by_node[n][0])]
    out: dict[str, list[list[int]]] = {}
    if max(len(g) for g in per_node) > 1:
        out["node"] = per_node
    if len(per_node) > 1 and len({len(g) for g in per_node}) == 1:
        out["across"] = [list(g) for g in zip(*per_node)]
        if len(per_node[0]) > 1:
            out["world"] = [list(range(len(nodes)))]
    return out


class Timer:
    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def mean_s(self, fn, iters: int, warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        self.sync()
        return (time.perf_counter() - t0) / iters


def collective(dist, op: str, nbytes: int, n: int, group, torch, device, dtype):
    """A no-argument function running `op` once on `nbytes` over a group of `n` ranks."""
    elems = max(n, nbytes // torch.tensor([], dtype=dtype).element_size() // n * n)
    big = torch.ones(elems, dtype=dtype, device=device)
    part = torch.empty(elems // n, dtype=dtype, device=device)
    out = torch.empty_like(big)
    return {"all_to_all": lambda: dist.all_to_all_single(out, big, group=group),
            "all_gather": lambda: dist.all_gather_into_tensor(out, part, group=group),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, big, group=group),
            "all_reduce": lambda: dist.all_reduce(big, group=group)}[op], elems * big.element_size()


def collectives(dist, torch, device, nodes, sizes, iters, rank) -> tuple[list, list]:
    rows, skipped = [], []
    found = shapes(nodes)
    if not found:
        skipped.append({"what": "collectives", "why": f"{len(nodes)} rank(s): no group of two or more ranks"})
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    timer = Timer(torch, device)
    for shape, groups in found.items():
        handles = [dist.new_group(g) for g in groups]  # every rank creates every group, in order
        mine = next(i for i, g in enumerate(groups) if rank in g)
        n, group = len(groups[mine]), handles[mine]
        spans = len({nodes[r] for r in groups[0]})
        for op in OPS:
            for size in sizes:
                fn, nbytes = collective(dist, op, size, n, group, torch, device, dtype)
                dist.barrier()
                t = torch.tensor([timer.mean_s(fn, iters)], dtype=torch.float64, device=device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the time
                s = float(t.item())
                alg = nbytes / s / 1e9
                rows.append({"kind": "collective", "op": op, "group": shape, "ranks": n, "nodes": spans,
                             "groups": len(groups), "bytes": nbytes, "us": round(s * 1e6, 3),
                             "algbw_gb_s": round(alg, 4), "busbw_gb_s": round(alg * BUS_FACTOR[op](n), 4)})
    return rows, skipped


def copies(torch, device) -> tuple[list, list]:
    if device.type != "cuda":
        return [], [{"what": "copy", "why": "no GPU: host/device copies not measured"}]
    timer = Timer(torch, device)
    host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    dev, dev2 = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device), torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    rows = []
    # device to device reads and writes each byte: counted twice, as HBM bandwidth is
    for op, fn, moved in (("h2d", lambda: dev.copy_(host, non_blocking=True), COPY_BYTES),
                          ("d2h", lambda: host.copy_(dev, non_blocking=True), COPY_BYTES),
                          ("d2d", lambda: dev2.copy_(dev), 2 * COPY_BYTES)):
        s = timer.mean_s(fn, 10)
        rows.append({"kind": "copy", "op": op, "bytes": COPY_BYTES, "us": round(s * 1e6, 3),
                     "gb_s": round(moved / s / 1e9, 3)})
    return rows, []


def gemm(torch, device) -> list:
    n = GEMM_N[device.type]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    s = Timer(torch, device).mean_s(lambda: a @ b, 10 if device.type == "cuda" else 3)
    return [{"kind": "gemm", "op": "matmul", "dtype": str(dtype).removeprefix("torch."), "n": n,
             "us": round(s * 1e6, 3), "tflop_s": round(2 * n ** 3 / s / 1e12, 4)}]


def deep_ep(dist, torch, device, nodes, rank, iters) -> tuple[list, list]:
    """DeepEP's normal (intranode) dispatch and combine over a node's ranks, as its own tests call
    them: 4096 tokens of hidden 7168 in BF16, top-8 of 256 experts, balanced."""
    if device.type != "cuda":
        return [], [{"what": "deep_ep", "why": "no GPU (gloo): DeepEP not measured"}]
    try:
        import deep_ep
    except Exception as e:  # an image without it, or one whose build does not load
        return [], [{"what": "deep_ep", "why": f"not importable: {type(e).__name__}: {str(e)[:200]}"}]
    mine = [r for r, n in enumerate(nodes) if n == nodes[rank]]
    if len(mine) < 2 or len(set(nodes)) > 1:
        return [], [{"what": "deep_ep", "why": "measured inside one node of two or more ranks only; "
                                              f"this job has {len(mine)} rank(s) on a node, {len(set(nodes))} node(s)"}]
    try:
        tokens, hidden, topk, experts = 4096, 7168, 8, 256
        n = dist.get_world_size()
        buf = deep_ep.Buffer(dist.group.WORLD, int(1e9), 0)
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device)
        scores = torch.randn(tokens, experts, device=device).abs()
        idx = scores.topk(topk, dim=-1).indices.to(torch.int64)
        weights = torch.ones(tokens, topk, dtype=torch.float32, device=device)
        per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, experts)
        args = dict(topk_idx=idx, topk_weights=weights, num_tokens_per_rank=per_rank,
                    num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
        recv, _, _, _, handle, _ = buf.dispatch(x, **args)
        timer = Timer(torch, device)
        d = timer.mean_s(lambda: buf.dispatch(x, **args), iters)
        c = timer.mean_s(lambda: buf.combine(recv, handle), iters)
        sent = int(in_rank.sum().item()) * hidden * 2  # tokens this rank sends, once per rank they go to
        t = torch.tensor([d, c], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        d, c = (float(v) for v in t.tolist())
        return [{"kind": "deep_ep", "op": op, "group": "node", "ranks": n, "nodes": 1, "bytes": sent,
                 "us": round(s * 1e6, 3), "gb_s": round(sent / s / 1e9, 3)} for op, s in
                (("dispatch", d), ("combine", c))], []
    except Exception as e:
        return [], [{"what": "deep_ep", "why": f"{type(e).__name__}: {str(e)[:300]}"}]


def nccl_version(torch) -> str:
    v = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="message sizes in bytes")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    a = p.parse_args(argv)
    import torch
    import torch.distributed as dist
    warnings.filterwarnings("ignore", category=FutureWarning)  # reduce_scatter_tensor's rename
    sizes = sorted({int(s) for s in a.sizes.split(",") if s})
    cuda = torch.cuda.is_available() and a.backend != "gloo"
    backend = "nccl" if cuda else "gloo"
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=world)
    nodes: list = [None] * world
    dist.all_gather_object(nodes, node_name())
    rows, skipped = collectives(dist, torch, device, nodes, sizes, a.iters, rank)
    for found, missed in (copies(torch, device), (gemm(torch, device), []),
                          deep_ep(dist, torch, device, nodes, rank, a.iters)):
        rows += found
        skipped += missed
    record = {"probe": "link_probe", "backend": backend, "world_size": world, "nodes": nodes,
              "device": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__,
              "nccl": nccl_version(torch) if cuda else None,
              "sizes": sizes, "iters": a.iters, "rows": rows, "skipped": skipped}
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        text = json.dumps(record, sort_keys=True)
        with open(a.out, "w") as f:
            f.write(text + "\n")
        print(MARKER + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
