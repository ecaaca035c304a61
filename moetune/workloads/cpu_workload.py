"""CPU stand-in for training: used where no GPU is (CI, laptops) so that submit → `nsys profile`
→ export → analyze runs for real. It is not training.

Takes the same Megatron argv a trial would (unknown flags are ignored), reads `--train-iters`,
`--global-batch-size`, `--profile-step-start/--profile-step-end`, burns CPU for each iteration,
wraps every iteration in an NVTX range `iteration N` (through ctypes: libnvToolsExt, or a
shim built from the NVTX headers nsys ships; else the `nvtx` pip package; see `nvtx_api`) and prints Megatron-style
iteration lines. Its own knobs:

    --stand-in-ms-per-iter MS   wall time of one iteration (default 50)
    --stand-in-busy FRACTION    share of each iteration spent burning CPU, the rest sleeps (1.0)
    --stand-in-alloc-mb MB      memory to hold (touched) for the whole run, to test --mem limits
    --stand-in-model-mb MB      memory a rank of the layout would need at micro batch 1 on one GPU,
                                reported (never held) as MB x micro batch / (TP x PP x EP), so that
                                fits of different layouts differ as real ones do
    --stand-in-slow-ranks R:X,...  rank R's iterations last X times as long, as one pipeline stage
                                (more layers, MoE, the loss) runs longer than another

With more than one rank (WORLD_SIZE > 1) the ranks first meet at MASTER_ADDR:MASTER_PORT over TCP,
as torch.distributed's rendezvous does (rank 0 listens, the others connect and send their rank and
node), so a wrong rendezvous address fails the job as it would fail training. Each rank writes
what it saw (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, node, pid, the ranks met) to
`rank_<RANK>.json` in MOETUNE_TRIAL_DIR (the job script sets it to the trial folder).
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import shutil
import socket
import sys
import time
from datetime import datetime


class _NoNvtx:
    source = "none"

    def push(self, name: str) -> None:
        pass

    def pop(self) -> None:
        pass


class _PipNvtx:
    source = "nvtx package"

    def __init__(self, mod):
        self.mod = mod

    def push(self, name: str) -> None:
        self.mod.push_range(name)

    def pop(self) -> None:
        self.mod.pop_range()


class _CtypesNvtx:
    source = "libnvToolsExt (ctypes)"

    def __init__(self, lib):
        self.lib = lib

    def push(self, name: str) -> None:
        self.lib.nvtxRangePushA(name.encode())

    def pop(self) -> None:
        self.lib.nvtxRangePop()


SHIM_C = b"""#include <nvtx3/nvToolsExt.h>
int nvtxRangePushA_shim(const char *s) { return nvtxRangePushA(s); }
int nvtxRangePop_shim(void) { return nvtxRangePop(); }
"""


def build_shim(include_dir: str) -> str | None:
    """NVTX v3 is header-only and Debian's nsys ships no libnvToolsExt.so, only the headers:
    compile a two-function library from them (once, cached) that ctypes can call. nsys's
    injection library (NVTX_INJECTION64_PATH) then records the ranges."""
    import hashlib
    import subprocess
    import tempfile
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc or not os.path.isdir(include_dir):
        return None
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "moetune")
    os.makedirs(cache, exist_ok=True)
    tag = hashlib.sha256(SHIM_C + include_dir.encode()).hexdigest()[:12]
    lib = os.path.join(cache, f"nvtx_shim_{tag}.so")
    if os.path.exists(lib):
        return lib
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src = os.path.join(tmp, "shim.c")
        with open(src, "wb") as f:
            f.write(SHIM_C)
        out = os.path.join(tmp, "shim.so")
        r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-I", include_dir, "-o", out, src, "-ldl"],
                           capture_output=True)
        if r.returncode:
            return None
        os.replace(out, lib)  # atomic: ranks may build at once
    return lib


class _ShimNvtx(_CtypesNvtx):
    source = "NVTX shim built from nsys's headers (ctypes)"

    def push(self, name: str) -> None:
        self.lib.nvtxRangePushA_shim(name.encode())

    def pop(self) -> None:
        self.lib.nvtxRangePop_shim()


def nvtx_api():
    """The first NVTX emitter that loads: a libnvToolsExt (MOETUNE_NVTX_LIB or the system's), a
    shim compiled from the NVTX headers of the nsys that runs us, the `nvtx` pip package, or
    none. (Under Debian's nsys 2022.4 the pip package's ranges are not recorded; the shim's are.)"""
    for path in (os.environ.get("MOETUNE_NVTX_LIB"), ctypes.util.find_library("nvToolsExt")):
        if path:
            try:
                lib = ctypes.CDLL(path)
                lib.nvtxRangePushA.argtypes = [ctypes.c_char_p]
                return _CtypesNvtx(lib)
            except (OSError, AttributeError):
                pass
    inj = os.environ.get("NVTX_INJECTION64_PATH", "")
    if inj:
        shim = build_shim(os.path.join(os.path.dirname(inj), "nvtx", "include"))
        if shim:
            lib = ctypes.CDLL(shim)
            lib.nvtxRangePushA_shim.argtypes = [ctypes.c_char_p]
            return _ShimNvtx(lib)
    try:
        import nvtx  # type: ignore
        return _PipNvtx(nvtx)
    except ImportError:
        return _NoNvtx()


def burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 1.0
    while time.perf_counter() < end:
        for _ in range(2000):
            x = x * 1.0000001 + 1e-9


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="moetune-cpu-stand-in", allow_abbrev=False)
    p.add_argument("--train-iters", type=int, default=10)
    p.add_argument("--global-batch-size", type=int, default=8)
    p.add_argument("--profile-step-start", type=int, default=None)
    p.add_argument("--profile-step-end", type=int, default=None)
    p.add_argument("--stand-in-ms-per-iter", type=float, default=50.0)
    p.add_argument("--stand-in-busy", type=float, default=1.0)
    p.add_argument("--stand-in-alloc-mb", type=int, default=0)
    p.add_argument("--stand-in-model-mb", type=float, default=0.0)
    p.add_argument("--stand-in-slow-ranks", type=slow_ranks, default={})
    # a Megatron flag whose presence stops the run at start-up, as Megatron's TransformerConfig
    # refuses some combinations (selective recompute inside a CUDA-graphed scope on the device)
    p.add_argument("--stand-in-refuse", default=None)
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--expert-model-parallel-size", "--micro-batch-size"):
        p.add_argument(flag, type=int, default=1)
    p.add_argument("--fake-process-group", action="store_true")  # a fit: this rank runs alone
    args, megatron_flags = p.parse_known_args(argv)
    args.refused = args.stand_in_refuse if args.stand_in_refuse in megatron_flags else None
    return args


def slow_ranks(text: str) -> dict[int, float]:
    """'R:X,...' -> {R: X}."""
    try:
        return {int(r): float(x) for r, x in (part.split(":") for part in text.split(",") if part.strip())}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected RANK:FACTOR[,RANK:FACTOR...]") from None


# the memory report's floor, as a rank of any layout allocates some (a report of nothing reads as no report)
BASE_MB = 256.0


def model_mb(args: argparse.Namespace) -> float:
    shards = args.tensor_model_parallel_size * args.pipeline_model_parallel_size * \
        args.expert_model_parallel_size
    return args.stand_in_model_mb * args.micro_batch_size / max(shards, 1)


def iteration_line(it: int, total: int, ms: float, gbs: int) -> str:
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return (f" [{stamp}] iteration {it:8d}/{total:8d} | consumed samples: {it * gbs:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.000000E-04 | "
            f"global batch size: {gbs:5d} | lm loss: {10.0 / it:.6E} | loss scale: 1.0 | "
            f"number of skipped iterations:   0 | number of nan iterations:   0 |")


RENDEZVOUS_S = 120.0  # how long ranks wait for each other (a trial's nsys start can take ~20 s)


def _send(conn: socket.socket, obj) -> None:
    conn.sendall(json.dumps(obj).encode() + b"\n")


def _recv(conn: socket.socket):
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("peer closed the rendezvous connection")
        data += chunk
    return json.loads(data)


def rendezvous(rank: int, world: int, addr: str, port: int, me: dict) -> list[dict]:
    """Every rank's `me`, in rank order, met over TCP at addr:port (rank 0 listens)."""
    deadline = time.monotonic() + RENDEZVOUS_S
    if rank == 0:
        with socket.create_server(("", port), backlog=world) as srv:
            srv.settimeout(RENDEZVOUS_S)
            peers, conns = {0: me}, []
            while len(peers) < world:
                conn, _ = srv.accept()
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                peer = _recv(conn)
                peers[int(peer["rank"])] = peer
                conns.append(conn)
            met = [peers[r] for r in sorted(peers)]
            for conn in conns:
                _send(conn, met)
                conn.close()
            return met
    while True:
        try:
            with socket.create_connection((addr, port), timeout=5) as conn:
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                _send(conn, me)
                return _recv(conn)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def launch_env() -> dict:
    """What the launcher gave this rank, and where it runs."""
    env = os.environ
    rank = int(env.get("RANK", env.get("SLURM_PROCID", "0")))
    return {"rank": rank, "local_rank": int(env.get("LOCAL_RANK", "0")),
            "world_size": int(env.get("WORLD_SIZE", "1")),
            "master_addr": env.get("MASTER_ADDR"), "master_port": env.get("MASTER_PORT"),
            "hostname": socket.gethostname(), "slurm_node": env.get("SLURMD_NODENAME"),
            "slurm_procid": env.get("SLURM_PROCID"), "slurm_localid": env.get("SLURM_LOCALID"),
            "slurm_job_id": env.get("SLURM_JOB_ID"), "pid": os.getpid(),
            "profiled": bool(env.get("NVTX_INJECTION64_PATH"))}


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    me = launch_env()
    rank = me["rank"]
    # a fit's rank runs alone, its peers skipped as Megatron's fake process group skips them
    if me["world_size"] > 1 and not args.fake_process_group and not (me["master_addr"] and me["master_port"]):
        # as torch.distributed's env:// rendezvous refuses to start
        print(f"[Rank {rank}] ValueError: {me['world_size']} ranks but MASTER_ADDR/MASTER_PORT not set "
              f"({me['master_addr']!r}, {me['master_port']!r})", file=sys.stderr, flush=True)
        return 1
    if me["world_size"] > 1 and not args.fake_process_group:
        try:
            me["met"] = [{"rank": p["rank"], "slurm_node": p["slurm_node"], "hostname": p["hostname"]}
                         for p in rendezvous(rank, me["world_size"], me["master_addr"],
                                             int(me["master_port"]), me)]
        except (OSError, ValueError) as e:
            print(f"[Rank {rank}] rendezvous at {me['master_addr']}:{me['master_port']} failed: {e}",
                  file=sys.stderr, flush=True)
            return 1
    if args.refused:
        print(f"Traceback (most recent call last):\nAssertionError: the stand-in refuses {args.refused} "
              "(as Megatron refuses a config at start-up)", file=sys.stderr, flush=True)
        return 1
    folder = os.environ.get("MOETUNE_TRIAL_DIR")
    if folder:
        path = os.path.join(folder, f"rank_{rank}.json")
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(me, f, indent=1, sort_keys=True)
            os.replace(path + ".tmp", path)
        except OSError as e:  # one line, one write: a step whose other ranks are being killed
            print(f"OSError: {e}", file=sys.stderr, flush=True)  # may cut a longer traceback short
            return 1
    nvtx = nvtx_api()
    hold = b"\x01" * (args.stand_in_alloc_mb * 2**20) if args.stand_in_alloc_mb else b""
    if rank == 0:
        print(f"moetune cpu stand-in (not training): {args.train_iters} iterations of "
              f"{args.stand_in_ms_per_iter} ms, NVTX via {nvtx.source}, holding {len(hold) >> 20} MB",
              flush=True)
    period = args.stand_in_ms_per_iter * args.stand_in_slow_ranks.get(rank, 1.0) / 1000
    for it in range(1, args.train_iters + 1):
        t0 = time.perf_counter()
        nvtx.push(f"iteration {it}")
        burn(period * args.stand_in_busy)
        rest = period - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)
        nvtx.pop()
        ms = (time.perf_counter() - t0) * 1000
        if rank == 0 or args.fake_process_group:  # alone in a fit, a rank reports as Megatron's would
            print(iteration_line(it, args.train_iters, ms, args.global_batch_size), flush=True)
            if it == 1:
                # what it holds and what the layout would, not the process's RSS: a GPU's max allocated
                # is the same for one layout run twice, and fits compare peaks to 0.2 %
                max_mb = BASE_MB + len(hold) / 2**20 + model_mb(args)
                print(f"[Rank {rank}] (after {it} iterations) memory (MB) | allocated: "
                      f"{max_mb:.1f} | max allocated: {max_mb:.1f} | reserved: {max_mb:.1f} | "
                      f"max reserved: {max_mb:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
