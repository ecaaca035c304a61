"""The preflight's probe: what a trial will meet on a compute node, as one JSON record.

Runs inside the job by its path, in the image and environment the trials get (no moetune there):
stdlib at import; torch, Transformer Engine, apex and DeepEP are imported in a child process of
this same script (`--imports`), so that a library that crashes the interpreter as it loads costs
its own entry, not the record. The record goes to stdout (one line, after the marker
`MOETUNE_PREFLIGHT `) and to `--out`.

    python preflight_probe.py --out FILE [--token-file FILE] [--nsys BINARY|off] [--workload-dir DIR]

What it records: Python; Megatron through the training entry's own check (`train_moe.py
--moetune-check`, one JSON line, exit 0 when the entry can run on the Megatron it finds, 3 when
not); torch, CUDA, the driver and the GPUs (nvidia-smi where present, else torch); Transformer
Engine, apex, DeepEP with HybridEP and NVSHMEM; the driver settings IBGDA needs; nsys and whether
it has `nsys recipe`; the CPUs (this task's and the node's) and NUMA nodes; InfiniBand devices;
and the token the login node wrote into the runs folder, read back by the same absolute path.
"""
from __future__ import annotations

import argparse
import glob
import importlib
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from importlib import metadata

MARKER = "MOETUNE_PREFLIGHT "
CHECK_TIMEOUT_S = 600  # importing Megatron on a cold file system takes a while
DISTRIBUTIONS = ("megatron-core", "torch", "transformer-engine", "transformer_engine_torch",
                 "apex", "deep-ep", "deep_ep", "nvidia-nvshmem-cu12", "nvidia-nvshmem-cu13",
                 "nvidia-nccl-cu12", "nvidia-nccl-cu13")
# DeepEP's deployment notes: IBGDA (its inter-node kernels) needs the NVIDIA driver loaded with
# stream memory operations and peer mapping override, or GDRCopy's driver for CPU-assisted IBGDA
DRIVER_PARAMS = ("/proc/driver/nvidia/params", "/sys/module/nvidia/parameters")


def _last_line(text: str) -> str:
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    return lines[-1][:300] if lines else ""


def _run(cmd: list[str], timeout: float = 60, **kw) -> tuple[int | None, str, str]:
    """(exit status or None when it could not run, stdout, stderr)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
        return r.returncode, r.stdout, r.stderr
    except FileNotFoundError:
        return None, "", f"{cmd[0]}: not found"
    except subprocess.TimeoutExpired:
        return None, "", f"{' '.join(cmd[:3])}: no answer in {timeout:.0f} s"
    except OSError as e:
        return None, "", f"{cmd[0]}: {e}"


# -- what a child process imports ---------------------------------------------------------------
def _import(name: str):
    return importlib.import_module(name)


def imports() -> dict:
    """torch, CUDA, Transformer Engine, apex, DeepEP: what imports and which version."""
    out: dict = {}
    try:
        torch = _import("torch")
        t = {"version": torch.__version__, "cuda": getattr(torch.version, "cuda", None),
             "cuda_available": bool(torch.cuda.is_available())}
        if t["cuda_available"]:
            t["devices"] = [{"name": torch.cuda.get_device_name(i),
                             "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 2)}
                            for i in range(torch.cuda.device_count())]
        out["torch"] = t
    except Exception as e:
        out["torch"] = {"version": None, "error": f"{type(e).__name__}: {e}"[:300]}
    try:
        te = _import("transformer_engine")
        _import("transformer_engine.pytorch")  # the core alone is not what Megatron uses
        out["transformer_engine"] = {"importable": True, "version": getattr(te, "__version__", None)}
    except Exception as e:
        out["transformer_engine"] = {"importable": False, "error": f"{type(e).__name__}: {e}"[:300]}
    try:
        _import("apex")
        # Megatron's gradient accumulation fusion and fused layer norm are apex's compiled parts
        fused = {m: _found(m) for m in ("fused_weight_gradient_mlp_cuda", "fused_layer_norm_cuda", "amp_C")}
        out["apex"] = {"importable": True, "fused": fused}
    except Exception as e:
        out["apex"] = {"importable": False, "error": f"{type(e).__name__}: {e}"[:300]}
    try:
        dep = _import("deep_ep")
        d = {"importable": True, "buffer": hasattr(dep, "Buffer"),
             # the class Megatron-Core's flex dispatcher imports for HybridEP
             "hybrid_ep": hasattr(dep, "HybridEPBuffer"), "version": getattr(dep, "__version__", None)}
        d["nvshmem_built"], d["nvshmem_note"] = _deep_ep_nvshmem(dep)
        out["deep_ep"] = d
    except Exception as e:
        out["deep_ep"] = {"importable": False, "hybrid_ep": False, "error": f"{type(e).__name__}: {e}"[:300]}
    return out


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _deep_ep_nvshmem(dep) -> tuple[bool | None, str | None]:
    """Was DeepEP built with NVSHMEM? Its RDMA buffer sizing for more ranks than one NVLink domain
    holds refuses ("NVSHMEM is disable during compilation") when it was not."""
    try:
        dep.Config(24, 6, 256, 6, 128).get_rdma_buffer_size_hint(7168 * 2, 16)
        return True, None
    except Exception as e:
        text = str(e)
        return (False if "NVSHMEM" in text else None), _last_line(text) or type(e).__name__


# -- what this process reads ------------------------------------------------------------------
def megatron(workload_dir: str) -> dict:
    """The training entry's own check of the Megatron it finds (one JSON line)."""
    entry = os.path.join(workload_dir, "train_moe.py")
    rc, out, err = _run([sys.executable, entry, "--moetune-check"], timeout=CHECK_TIMEOUT_S)
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                break
            if isinstance(found, dict):
                return {**found, "rc": rc}
    why = _last_line(err) or _last_line(out) or f"exit status {rc}"
    return {"entry": f"{os.path.basename(entry)} --moetune-check failed: {why}", "rc": rc,
            "megatron_core": None, "fix": None, "check_failed": True}


def packages() -> dict:
    found = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def nvshmem() -> dict:
    """Where an NVSHMEM library is: NVSHMEM_HOME, the pip wheel's folder, the system's."""
    places = [os.environ.get("NVSHMEM_HOME", ""), os.environ.get("NVSHMEM_DIR", "")]
    places += [os.path.join(p, "nvidia", "nvshmem") for p in sys.path if p]
    places += ["/usr/lib/x86_64-linux-gnu/nvshmem", "/usr/local/nvshmem", "/opt/nvshmem"]
    libs = []
    for p in places:
        if p:
            for pattern in ("lib/libnvshmem*.so*", "lib64/libnvshmem*.so*", "libnvshmem*.so*"):
                libs += glob.glob(os.path.join(p, pattern))
    return {"libraries": sorted(set(libs))[:8]}


def driver_params() -> dict:
    """The NVIDIA driver's module parameters that IBGDA needs, and GDRCopy's device."""
    got: dict = {"source": None}
    path = DRIVER_PARAMS[0]
    if os.path.exists(path):
        got["source"] = path
        with open(path) as f:
            params = dict(line.split(":", 1) for line in f if ":" in line)
        params = {k.strip(): v.strip().strip('"') for k, v in params.items()}
        got["EnableStreamMemOPs"] = params.get("EnableStreamMemOPs")
        got["RegistryDwords"] = params.get("RegistryDwords")
    elif os.path.isdir(DRIVER_PARAMS[1]):
        got["source"] = DRIVER_PARAMS[1]
        for key in ("EnableStreamMemOPs", "RegistryDwords"):
            try:
                with open(os.path.join(DRIVER_PARAMS[1], "NVreg_" + key)) as f:
                    got[key] = f.read().strip().strip('"')
            except OSError:
                got[key] = None
    got["peer_mapping_override"] = "PeerMappingOverride=1" in (got.get("RegistryDwords") or "")
    got["stream_mem_ops"] = got.get("EnableStreamMemOPs") == "1"
    got["gdrdrv"] = os.path.exists("/dev/gdrdrv")
    return got


def gpus() -> dict:
    rc, out, err = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,pci.bus_id",
                         "--format=csv,noheader,nounits"])
    if rc != 0:
        return {"source": None, "error": _last_line(err) or _last_line(out) or f"exit status {rc}",
                "devices": [], "driver": None}
    devices = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            devices.append({"name": parts[0], "memory_gb": round(float(parts[1]) / 1024, 2),
                            "driver": parts[2], "numa_node": _pci_numa(parts[3])})
    rc, out, _ = _run(["nvidia-smi"])
    cuda = next((ln.split("CUDA Version:")[1].split()[0] for ln in out.splitlines()
                 if "CUDA Version:" in ln), None)
    return {"source": "nvidia-smi", "devices": devices,
            "driver": devices[0]["driver"] if devices else None, "driver_cuda": cuda}


def _pci_numa(bus_id: str) -> int | None:
    # nvidia-smi writes 00000000:1B:00.0; sysfs names it 0000:1b:00.0
    bus = bus_id.lower()
    if len(bus.split(":")[0]) == 8:
        bus = bus[4:]
    try:
        with open(f"/sys/bus/pci/devices/{bus}/numa_node") as f:
            node = int(f.read().strip())
        return node if node >= 0 else None
    except (OSError, ValueError):
        return None


def cpus() -> dict:
    nodes = {}
    for d in sorted(glob.glob("/sys/devices/system/node/node[0-9]*")):
        try:
            with open(os.path.join(d, "cpulist")) as f:
                nodes[os.path.basename(d)[4:]] = f.read().strip()
        except OSError:
            nodes[os.path.basename(d)[4:]] = None
    task = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"task": task, "node": os.cpu_count(), "numa_nodes": nodes}


def infiniband() -> list[str]:
    return sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []


def nsys(binary: str) -> dict:
    if binary in ("", "off"):
        return {"binary": binary, "off": True}
    path = shutil.which(binary)
    if not path:
        return {"binary": binary, "path": None, "version": None, "recipe": False,
                "error": f"{binary}: not found on PATH"}
    rc, out, err = _run([path, "--version"])
    version = next((w for w in (out + " " + err).split() if w[:1].isdigit() and "." in w), None)
    rc_recipe, _, _ = _run([path, "recipe", "--help"])
    return {"binary": binary, "path": path, "version": version, "recipe": rc_recipe == 0}


def token(path: str | None) -> dict:
    if not path:
        return {"path": None}
    try:
        with open(path) as f:
            return {"path": path, "seen": f.read().strip()}
    except OSError as e:
        return {"path": path, "seen": None, "error": f"{type(e).__name__}: {e.strerror or e}"}


def child_imports(timeout: float = 600) -> dict:
    rc, out, err = _run([sys.executable, os.path.abspath(__file__), "--imports"], timeout=timeout)
    for line in reversed(out.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    return {"error": f"importing torch and its extensions ended the interpreter (exit status {rc}): "
                     f"{_last_line(err) or _last_line(out)}"}


def record(args) -> dict:
    t0 = time.time()
    rec = {"probe": 1, "host": socket.gethostname(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "python": {"version": platform.python_version(), "executable": sys.executable},
           "slurm": {k: os.environ.get(k) for k in ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_JOB_PARTITION")},
           "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "runs_folder": token(args.token_file), "cpus": cpus(), "infiniband": infiniband(),
           "gpus": gpus(), "driver_params": driver_params(), "nvshmem": nvshmem(),
           "nsys": nsys(args.nsys), "packages": packages()}
    rec.update(child_imports())
    rec["megatron"] = megatron(args.workload_dir)
    rec["probe_s"] = round(time.time() - t0, 1)
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="where to write the record (JSON)")
    p.add_argument("--token-file", help="the runs folder's token, written by the login node")
    p.add_argument("--nsys", default="nsys", help="the nsys the trials run (off: none)")
    p.add_argument("--workload-dir", default=os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--imports", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.imports:
        print(MARKER + json.dumps(imports(), default=str), flush=True)
        return 0
    rec = record(args)
    text = json.dumps(rec, default=str, sort_keys=True)
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, args.out)
    print(MARKER + text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
