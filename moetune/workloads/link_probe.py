"""The calibration's probe: the cluster's links and one GPU's rates, measured, as one JSON record
of rows.

Runs inside the job by its path, in the trials' image, one process a rank (torch only, no moetune
there): the rendezvous from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (what the job
script or torchrun sets; alone, one rank here). NCCL on GPUs, gloo on CPU.

    python link_probe.py --out FILE [--sizes BYTES,...] [--iters N] [--backend auto|nccl|gloo]
    python link_probe.py --show FILE     # a record's rows as a table

Rows (rank 0 writes them):
- collective: all_to_all, all_gather, reduce_scatter, all_reduce of each size over each group
  shape: `node` (a node's ranks), `across` (one rank of each node), `world` (all, where that is a
  third shape); every group of a shape runs at once, and a row's time is the slowest rank's mean.
  `bytes` is the whole tensor (all-gather's output, reduce-scatter's input, a rank's all-to-all
  send buffer); bus bandwidth as nccl-tests counts it.
- copy: host to device (pinned), device to host, device to device; gemm: BF16 matrix products
  (GPU) or FP32 (CPU), one large square and a sweep of a step's shapes; launch: the host's time to
  launch a small eager op; deep_ep, hybrid_ep: DeepEP's and HybridEP's dispatch and combine over a
  node's ranks where the image has them (`gb_s`: the bytes a rank sends over the time).
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
# (tokens, hidden, output width): a micro-batch's tokens, or an expert's share of them, times the
# widths MoE layers have (an expert's FFN, a fused gate-and-up, attention's projections)
GEMM_SWEEP = {"cuda": tuple((m, 4096, w) for m in (256, 1024, 4096, 16384) for w in (1536, 4096, 12288)),
              "cpu": ((64, 256, 256), (256, 256, 512))}
LAUNCHES, LAUNCH_ROUNDS = 2000, 5
GEMM_ROUNDS = 5
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
        out["across"] = [list(g) for g in zip(*per_node, strict=False)]
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

    def median_s(self, fn, iters: int, rounds: int) -> float:
        """The median of `rounds` means: a shared host's rounds differ by a fifth."""
        return sorted(self.mean_s(fn, iters) for _ in range(rounds))[rounds // 2]

    def kernel_s(self, fn, iters: int, rounds: int) -> float:
        """The GPU's own time for `fn`: on a GPU, `iters` calls captured in a CUDA graph and replayed,
        so no launch from a busy host leaves the GPU waiting between them (what a trace's kernel time
        counts); on CPU, median_s."""
        if not self.cuda:
            return self.median_s(fn, iters, rounds)
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the capture, as torch's graph docs ask
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                fn()
        return self.median_s(graph.replay, 5, rounds) / iters


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
    dev, dev2 = (torch.empty(COPY_BYTES, dtype=torch.uint8, device=device) for _ in range(2))
    rows = []
    # device to device reads and writes each byte: counted twice, as HBM bandwidth is
    for op, fn, moved in (("h2d", lambda: dev.copy_(host, non_blocking=True), COPY_BYTES),
                          ("d2h", lambda: host.copy_(dev, non_blocking=True), COPY_BYTES),
                          ("d2d", lambda: dev2.copy_(dev), 2 * COPY_BYTES)):
        s = timer.mean_s(fn, 10)
        rows.append({"kind": "copy", "op": op, "bytes": COPY_BYTES, "us": round(s * 1e6, 3),
                     "gb_s": round(moved / s / 1e9, 3)})
    return rows, []


def _sig(x: float) -> float:
    return float(f"{x:.5g}")  # five significant figures: a CPU's tiny GEMMs keep theirs


def _gemm_row(torch, device, m: int, k: int, n: int, op: str, iters: int) -> dict:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    s = Timer(torch, device).kernel_s(lambda: a @ b, iters, GEMM_ROUNDS)
    flop = 2 * m * k * n
    return {"kind": "gemm", "op": op, "dtype": str(dtype).removeprefix("torch."), "m": m, "k": k, "n": n,
            "gflop": _sig(flop / 1e9), "us": _sig(s * 1e6), "tflop_s": _sig(flop / s / 1e12)}


def gemm(torch, device) -> list:
    """The square product (`matmul`, the peak a large GEMM reaches) and a sweep of a training step's
    shapes (`mnk`: tokens by hidden by an output width, small to large), from which the calibration
    reads how a GEMM's efficiency grows with its size."""
    n = GEMM_N[device.type]
    iters = 20 if device.type == "cuda" else 3
    rows = [_gemm_row(torch, device, n, n, n, "matmul", iters)]
    for m, k, w in GEMM_SWEEP[device.type]:
        rows.append(_gemm_row(torch, device, m, k, w, "mnk", iters))
    return rows


def launches(torch, device) -> list:
    """The host's time to launch one small eager op (the cluster CPU's single-thread speed at what a
    training step's host does most): a 1-element in-place add enqueued LAUNCHES times without a sync
    (on a GPU its kernel is shorter than its launch, so the host sets the pace); the median of
    LAUNCH_ROUNDS rounds, as a shared host's rounds differ by a fifth."""
    x = torch.zeros(1, device=device)
    timer = Timer(torch, device)
    rounds = []
    for _ in range(LAUNCH_ROUNDS):
        for _ in range(100):
            x.add_(1)
        timer.sync()
        t0 = time.perf_counter()
        for _ in range(LAUNCHES):
            x.add_(1)
        rounds.append((time.perf_counter() - t0) / LAUNCHES)
        timer.sync()
    s = sorted(rounds)[len(rounds) // 2]
    return [{"kind": "launch", "op": "eager_add", "n": LAUNCHES, "rounds": LAUNCH_ROUNDS, "us": round(s * 1e6, 4)}]


# one MoE layer's exchange, as DeepEP's own tests size it: 4096 tokens of hidden 7168 in BF16,
# top-8 of 256 experts, routing balanced in expectation
EP_TOKENS, EP_HIDDEN, EP_TOPK, EP_EXPERTS = 4096, 7168, 8, 256


def _deepep(deep_ep, torch, group, n, x, idx, weights, timer, iters) -> tuple[float, float, int]:
    """(dispatch s, combine s, bytes sent) of DeepEP's normal kernels, its buffer sized as Megatron sizes it."""
    hidden_bytes = x.size(1) * max(x.element_size(), 2)
    nvl = max(cfg.get_nvl_buffer_size_hint(hidden_bytes, n) for cfg in
              (deep_ep.Buffer.get_dispatch_config(n), deep_ep.Buffer.get_combine_config(n)))
    buf = deep_ep.Buffer(group, nvl, 0)
    per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, EP_EXPERTS)
    args = dict(topk_idx=idx, topk_weights=weights, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
                is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    recv, _, _, _, handle, _ = buf.dispatch(x, **args)
    d = timer.mean_s(lambda: buf.dispatch(x, **args), iters)
    c = timer.mean_s(lambda: buf.combine(recv, handle), iters)
    return d, c, int(in_rank.sum().item()) * x.size(1) * x.element_size()


def _hybridep(deep_ep, torch, group, n, x, idx, weights, timer, iters) -> tuple[float, float, int]:
    """(dispatch s, combine s, bytes sent) of HybridEP's dispatch and combine with permute, called as
    Megatron-Core's flex dispatcher calls them (a routing map and probabilities over all experts)."""
    local = EP_EXPERTS // n
    routing = torch.zeros(x.size(0), EP_EXPERTS, dtype=torch.bool, device=x.device).scatter_(1, idx, True)
    probs = torch.zeros(x.size(0), EP_EXPERTS, dtype=torch.float32, device=x.device).scatter_(1, idx, weights)
    buf = deep_ep.HybridEPBuffer(group=group, hidden_dim=x.size(1), max_num_of_tokens_per_rank=x.size(0),
                                 num_local_experts=local, use_fp8=False)
    call = dict(hidden=x, routing_map=routing, probs=probs, scaling_factor=None, num_of_experts_per_rank=local)
    out, out_probs, _, _, handle = buf.dispatch_with_permute(**call)
    d = timer.mean_s(lambda: buf.dispatch_with_permute(**call), iters)
    c = timer.mean_s(lambda: buf.combine_with_unpermute(hidden=out, probs=out_probs, handle=handle), iters)
    ranks = routing.view(x.size(0), n, local).any(-1).sum().item()  # tokens x ranks they go to
    return d, c, int(ranks) * x.size(1) * x.element_size()


EP_BACKENDS = {"deep_ep": ("Buffer", _deepep), "hybrid_ep": ("HybridEPBuffer", _hybridep)}


def deep_ep(dist, torch, device, nodes, rank, iters) -> tuple[list, list]:
    """DeepEP's and HybridEP's dispatch and combine over a node's ranks (every node's at once)."""
    if device.type != "cuda":
        return [], [{"what": k, "why": "no GPU (gloo): not measured"} for k in EP_BACKENDS]
    try:
        import deep_ep
    except Exception as e:  # an image without it, or one whose build does not load
        return [], [{"what": k, "why": f"deep_ep not importable: {type(e).__name__}: {str(e)[:200]}"}
                    for k in EP_BACKENDS]
    groups = shapes(nodes).get("node")
    if not groups or len({len(g) for g in groups}) > 1:
        return [], [{"what": k, "why": "needs two or more ranks on each node, as many on each"} for k in EP_BACKENDS]
    handles = [dist.new_group(g) for g in groups]
    mine = next(i for i, g in enumerate(groups) if rank in g)
    group, n = handles[mine], len(groups[mine])
    os.environ.setdefault("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", str(n))  # HybridEP reads the domain here
    torch.manual_seed(rank)
    x = torch.randn(EP_TOKENS, EP_HIDDEN, dtype=torch.bfloat16, device=device)
    idx = torch.rand(EP_TOKENS, EP_EXPERTS, device=device).topk(EP_TOPK, dim=-1).indices.to(torch.int64)
    weights = torch.full((EP_TOKENS, EP_TOPK), 1.0 / EP_TOPK, dtype=torch.float32, device=device)
    timer = Timer(torch, device)
    rows, skipped = [], []
    for kind, (cls, bench) in EP_BACKENDS.items():
        if not hasattr(deep_ep, cls):
            skipped.append({"what": kind, "why": f"this deep_ep has no {cls}"})
            continue
        d = c = sent = failed = 0.0
        try:
            d, c, sent = bench(deep_ep, torch, group, n, x, idx, weights, timer, iters)
        except Exception as e:
            skipped.append({"what": kind, "why": f"rank {rank}: {type(e).__name__}: {str(e)[:300]}"})
            failed = 1.0
        # every rank joins, measured or not, so that none waits on another; the slowest sets the time
        t = torch.tensor([d, c, float(sent), failed], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        d, c, sent, failed = t.tolist()
        if not failed:
            rows += [{"kind": kind, "op": op, "group": "node", "ranks": n, "nodes": 1, "groups": len(groups),
                      "bytes": int(sent), "us": round(s * 1e6, 3), "gb_s": round(sent / s / 1e9, 3)}
                     for op, s in (("dispatch", d), ("combine", c))]
    return rows, skipped


def table(record: dict) -> list[str]:
    """The record's rows as lines of a table, then what was skipped and why."""
    lines = [f"  {'kind':<10} {'op':<15} {'group':<7} {'ranks':>5} {'size':>17} {'us':>11} {'rate':>9}"]
    for row in record["rows"]:
        size = row.get("bytes") or "x".join(str(row[k]) for k in ("m", "k", "n") if k in row) or row.get("n", "-")
        rate = row.get("busbw_gb_s", row.get("gb_s", row.get("tflop_s")))
        rate = "" if rate is None else f"{rate:>9.4g} {'TFLOP/s' if 'tflop_s' in row else 'GB/s'}"
        lines.append(f"  {row['kind']:<10} {row['op']:<15} {row.get('group', '-'):<7} {row.get('ranks', 1):>5} "
                     f"{size:>17} {row['us']:>11.2f} {rate}")
    return lines + [f"  skipped {s['what']}: {s['why']}" for s in record.get("skipped", [])]


def nccl_version(torch) -> str:
    v = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="where the record goes")
    p.add_argument("--show", metavar="RECORD", help="print a written record's rows as a table, and stop")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="message sizes in bytes")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    a = p.parse_args(argv)
    if a.show:
        record = json.loads(open(a.show).read())
        print(f"{record['device']}, {record['world_size']} rank(s), {record['backend']} {record.get('nccl')}, "
              f"torch {record['torch']}")
        print("\n".join(table(record)))
        return 0
    if not a.out:
        p.error("--out is required to measure")
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
    for found, missed in (copies(torch, device), (gemm(torch, device) + launches(torch, device), []),
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
