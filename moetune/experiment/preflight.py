"""What the preflight's record (workloads/preflight_probe.py) means for a cluster: the problems, each one
line naming what is missing and the fix, and the capabilities it implies.

    problems(record, cluster)    -> [Problem]  (blocking ones stop the tuner before its first trial)
    capabilities(record, cluster) -> {has_transformer_engine, has_deep_ep, ..., gpus_per_node, ...}
    resolve(cluster, capabilities) -> the cluster the rules and constraints decide with: each
                                      probed value where the experiment leaves the key unset (None);
                                      a value the YAML sets explicitly wins
    summary_rows(record)          -> [(what, found)] for the CLI's table

Pure: no job, no store. The checks are one table (CHECKS) of rows (name, applies to the cluster,
fails on the record, message, fix, blocking).
"""
from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moetune.experiment.schema import Cluster

# the cluster keys a probe may fill: None in the experiment means "what the preflight found"
PROBED_KEYS = ("has_transformer_engine", "has_deep_ep", "has_hybrid_ep", "has_apex", "gpu_memory_gb")
# what shapes what the probe sees: a stored record is reused only while these are unchanged
FINGERPRINT_KEYS = ("template", "container_image", "container_mounts", "container_writable", "venv",
                    "modules", "python", "megatron_path", "workdir", "env", "nsys", "workload",
                    "partition", "account", "gpus_per_node", "gres")
# where the entry's own check names no fix (it could not run at all)
MEGATRON_FIX = ("install megatron-core 0.17 or later in the image (pip install megatron-core==0.19.2), or "
                "point cluster.megatron_path at a Megatron-LM tree that has megatron/training")


@dataclass(frozen=True)
class Problem:
    check: str
    blocking: bool
    message: str
    fix: str

    @property
    def line(self) -> str:
        return f"{self.message}; fix: {self.fix}"

    def to_dict(self) -> dict:
        return {"check": self.check, "blocking": self.blocking, "message": self.message, "fix": self.fix,
                "line": self.line}


# -- reading the record ------------------------------------------------------------------------
def _sec(rec: dict, key: str) -> dict:
    v = rec.get(key)
    return v if isinstance(v, dict) else {}


def _gpus(rec: dict) -> list[dict]:
    """The node's GPUs as the job saw them: nvidia-smi's list, else torch's."""
    return _sec(rec, "gpus").get("devices") or _sec(rec, "torch").get("devices") or []


def _megatron_ok(rec: dict) -> bool:
    return _sec(rec, "megatron").get("entry") == "ok"


def _ibgda_ok(rec: dict) -> bool:
    d = _sec(rec, "driver_params")
    return bool((d.get("stream_mem_ops") and d.get("peer_mapping_override")) or d.get("gdrdrv"))


def _nsys_on(c: Cluster) -> bool:
    return c.nsys not in ("", "off")


def _workload(c: Cluster) -> str:
    return c.workload


def _multi_node(c: Cluster) -> bool:
    return c.nodes > 1


def _ran(rec: dict) -> bool:
    return not rec.get("job_error") and "probe" in rec


def _token(rec: dict) -> tuple[Any, Any]:
    r = _sec(rec, "runs_folder")
    return r.get("expected"), r.get("seen")


def _host(rec: dict) -> str:
    return str(rec.get("host") or _sec(rec, "slurm").get("SLURMD_NODENAME") or "the compute node")


def _megatron_message(rec: dict) -> str:
    m = _sec(rec, "megatron")
    found = m.get("megatron_core")
    where = f"megatron-core {found}" + (f" from {m['megatron_from']}" if m.get("megatron_from") else "") \
        if found else "no megatron-core"
    return f"the training entry cannot run on this image's Megatron ({where}): {m.get('entry') or 'no answer'}"


# -- the checks --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    name: str
    applies: Callable[[Cluster], bool]  # on the cluster section
    fails: Callable[[dict, Cluster], bool]  # on (record, cluster)
    message: Callable[[dict, Cluster], str]
    fix: Callable[[dict, Cluster], str]
    blocking: bool


def _always(_c: Cluster) -> bool:
    return True


def _megatron(c: Cluster) -> bool:
    return _workload(c) == "megatron"


CHECKS: tuple[Check, ...] = (
    Check("job", _always, lambda r, c: not _ran(r),
          lambda r, c: f"the preflight job did not report ({r.get('job_error') or 'no record'})",
          lambda r, c: "look at the job's log named above; check cluster.partition, account and the "
                       "image", True),
    # the login node writes a token into the preflight's folder; the job reads it by the same path
    Check("runs_folder", _always, lambda r, c: _ran(r) and _token(r)[0] != _token(r)[1],
          lambda r, c: (f"the runs folder is not the same on {_host(r)}: "
                        + (f"it read {str(_token(r)[1])[:16]!r} at {_sec(r, 'runs_folder').get('path')}, the login "
                           f"node wrote {str(_token(r)[0])[:16]!r}" if _token(r)[1] is not None else
                           f"{_sec(r, 'runs_folder').get('path')}: "
                           f"{_sec(r, 'runs_folder').get('error') or 'not read'}")),
          lambda r, c: "give --runs a folder on a file system the compute nodes mount at the same path "
                       "(for containers, mount it: cluster.container_mounts)", True),
    Check("imports", _megatron, lambda r, c: _ran(r) and bool(r.get("error")),
          lambda r, c: f"Python in the image crashed importing torch and its extensions: {r.get('error')}",
          lambda r, c: "run the image's python -c 'import torch, transformer_engine' on a GPU node and repair "
                       "what it names", True),
    Check("megatron", _megatron, lambda r, c: _ran(r) and not _megatron_ok(r),
          lambda r, c: _megatron_message(r),
          lambda r, c: _sec(r, "megatron").get("fix") or MEGATRON_FIX, True),
    Check("gpu", _megatron, lambda r, c: _ran(r) and not _gpus(r),
          lambda r, c: f"no GPU visible to the job on {_host(r)} "
                       f"({_sec(r, 'gpus').get('error') or 'nvidia-smi and torch list none'})",
          lambda r, c: "submit to a GPU partition (cluster.partition); where the site asks for GPUs by "
                       "--gres, set cluster.gres (e.g. gpu:8)", True),
    Check("gpus_per_node", _megatron,
          lambda r, c: _ran(r) and 0 < len(_gpus(r)) < (c.gpus_per_node or 1),
          lambda r, c: f"cluster.gpus_per_node is {c.gpus_per_node} but the job on {_host(r)} "
                       f"sees {len(_gpus(r))} GPUs",
          lambda r, c: f"set cluster.gpus_per_node: {len(_gpus(r))}, or ask for whole nodes", True),
    Check("torch_cuda", _megatron,
          lambda r, c: _ran(r) and bool(_gpus(r)) and not _sec(r, "torch").get("cuda_available"),
          lambda r, c: "torch cannot use the GPUs: " + (_sec(r, "torch").get("error") or
                       f"torch {_sec(r, 'torch').get('version')} (CUDA {_sec(r, 'torch').get('cuda')}) "
                       f"on driver {_sec(r, 'gpus').get('driver')}"),
          lambda r, c: "use an image whose torch is built for this driver's CUDA "
                       f"({_sec(r, 'gpus').get('driver_cuda') or 'see nvidia-smi'})", True),
    Check("nsys", _nsys_on, lambda r, c: _ran(r) and not _sec(r, "nsys").get("path"),
          lambda r, c: f"nsys {c.nsys!r} not found in the job on {_host(r)}",
          lambda r, c: "install Nsight Systems in the image or set cluster.nsys to its path there", True),
    # notes: the tuner goes on, without what they name
    Check("nsys_recipe", _nsys_on,
          lambda r, c: _ran(r) and bool(_sec(r, "nsys").get("path")) and not _sec(r, "nsys").get("recipe"),
          lambda r, c: f"nsys {_sec(r, 'nsys').get('version')} has no `nsys recipe`: reports show moetune's "
                       "figures without NVIDIA's recipes beside them",
          lambda r, c: "Nsight Systems 2023.x or later in the image", False),
    Check("transformer_engine", _megatron,
          lambda r, c: _ran(r) and not r.get("error") and not _sec(r, "transformer_engine").get("importable"),
          lambda r, c: "Transformer Engine does not import "
                       f"({_sec(r, 'transformer_engine').get('error')}): its fixes are not proposed",
          lambda r, c: "an image with Transformer Engine (NVIDIA's PyTorch or NeMo containers)", False),
    Check("deep_ep", _megatron,
          lambda r, c: _ran(r) and not r.get("error") and not _sec(r, "deep_ep").get("importable"),
          lambda r, c: f"DeepEP does not import ({_sec(r, 'deep_ep').get('error')}): the flex dispatcher "
                       "(DeepEP, HybridEP) is not proposed",
          lambda r, c: "build DeepEP's hybrid-ep branch with NVSHMEM into the image "
                       "(benchmarks/device_setup.sh deepep shows how)", False),
    Check("hybrid_ep", _megatron,
          lambda r, c: (_ran(r) and bool(_sec(r, "deep_ep").get("importable"))
                        and not _sec(r, "deep_ep").get("hybrid_ep")),
          lambda r, c: "DeepEP has no HybridEPBuffer: HybridEP is not proposed",
          lambda r, c: "build DeepEP from its hybrid-ep branch", False),
    Check("deep_ep_nvshmem", lambda c: _megatron(c) and _multi_node(c),
          lambda r, c: _ran(r) and _sec(r, "deep_ep").get("nvshmem_built") is False,
          lambda r, c: f"DeepEP was built without NVSHMEM ({_sec(r, 'deep_ep').get('nvshmem_note')}): its "
                       "inter-node dispatch cannot run, so DeepEP is not proposed across nodes",
          lambda r, c: "rebuild DeepEP with NVSHMEM_DIR set (the nvidia-nvshmem wheel will do)", False),
    Check("ibgda", lambda c: _megatron(c) and _multi_node(c),
          lambda r, c: _ran(r) and bool(_sec(r, "deep_ep").get("importable"))
          and bool(_sec(r, "driver_params").get("source")) and not _ibgda_ok(r),
          lambda r, c: "the NVIDIA driver runs without NVreg_EnableStreamMemOPs=1 and PeerMappingOverride=1 "
                       "and there is no GDRCopy (/dev/gdrdrv): DeepEP's inter-node kernels (IBGDA) cannot "
                       "run, so DeepEP is not proposed across nodes",
          lambda r, c: "set both in /etc/modprobe.d/nvidia.conf and rebuild the initramfs, or load GDRCopy's "
                       "gdrdrv (DeepEP's NVSHMEM notes)", False),
    Check("infiniband", lambda c: _megatron(c) and _multi_node(c),
          lambda r, c: _ran(r) and not r.get("infiniband"),
          lambda r, c: f"no InfiniBand device visible in the job on {_host(r)}: NCCL between nodes falls "
                       "back to sockets",
          lambda r, c: "run on a partition with InfiniBand; in a container, make /dev/infiniband visible "
                       "(the site's enroot hooks)", False),
    Check("apex", _megatron,
          lambda r, c: _ran(r) and not r.get("error") and not _sec(r, "apex").get("importable"),
          lambda r, c: "apex does not import: gradient accumulation fusion is off, CUDA graphs of attn "
                       "with delayed wgrad are not proposed",
          lambda r, c: "an NVIDIA PyTorch container (it has apex)", False),
)


def problems(record: dict, cluster: Cluster) -> list[Problem]:
    c = cluster
    return [Problem(ch.name, ch.blocking, ch.message(record, c), ch.fix(record, c))
            for ch in CHECKS if ch.applies(c) and ch.fails(record, c)]


def blocking(found: list[Problem]) -> list[Problem]:
    return [p for p in found if p.blocking]


# -- what it implies ---------------------------------------------------------------------------
def capabilities(record: dict, cluster: Cluster | None = None) -> dict:
    """What the probe found, under the cluster's key names; a key is left out where the probe could
    not tell (the job did not run, or the imports crashed). None: the schema's default cluster."""
    c = cluster or Cluster()
    caps: dict = {}
    if not _ran(record):
        return caps
    # the CPU stand-in runs in the tuner's own venv: its libraries say nothing of a GPU image
    if not record.get("error") and _workload(c) == "megatron":
        te, dep, apex = _sec(record, "transformer_engine"), _sec(record, "deep_ep"), _sec(record, "apex")
        caps["has_transformer_engine"] = bool(te.get("importable"))
        # across nodes DeepEP needs NVSHMEM and IBGDA as well (the notes of the same names say so)
        across = _multi_node(c) and (dep.get("nvshmem_built") is False or
                                     (_sec(record, "driver_params").get("source") and not _ibgda_ok(record)))
        caps["has_deep_ep"] = bool(dep.get("importable")) and not across
        caps["has_hybrid_ep"] = bool(dep.get("hybrid_ep")) and caps["has_deep_ep"]
        caps["has_apex"] = bool(apex.get("importable")) and \
            bool((apex.get("fused") or {}).get("fused_weight_gradient_mlp_cuda"))
    gpus = _gpus(record)
    if gpus:
        caps["gpus_per_node"] = len(gpus)
        caps["gpu_memory_gb"] = min(float(g["memory_gb"]) for g in gpus)
    cpus = _sec(record, "cpus")
    if cpus.get("node"):
        caps["node_cpus"] = int(cpus["node"])
    if cpus.get("task"):
        caps["task_cpus"] = int(cpus["task"])
    if cpus.get("numa_nodes") is not None:
        caps["numa_nodes"] = len(cpus["numa_nodes"])
    if _megatron_ok(record) and _sec(record, "megatron").get("megatron_core"):
        caps["megatron_core"] = str(_sec(record, "megatron")["megatron_core"])
    return caps


def resolve(cluster: Cluster, caps: dict) -> Cluster:
    """The cluster with each probed value where the experiment leaves the key unset (None); an
    explicit value in the YAML overrides the probe."""
    update = {k: caps[k] for k in PROBED_KEYS if caps.get(k) is not None and getattr(cluster, k) is None}
    return cluster.model_copy(update=update) if update else cluster


# -- keys -------------------------------------------------------------------------------------
def image_key(cluster: Cluster) -> str:
    """What software the trials meet: the container image, else the venv or interpreter."""
    c = cluster.model_dump()
    if c.get("template") == "container" and c.get("container_image"):
        return str(c["container_image"])
    if c.get("python"):
        return f"python:{c['python']}"
    if c.get("venv"):
        return f"venv:{c['venv']}"
    return f"python:{sys.executable}"  # job/render.py runs the tuner's own interpreter then


def fingerprint(cluster: Cluster, runs_root: str) -> str:
    c = cluster.model_dump()
    what = {k: c.get(k) for k in FINGERPRINT_KEYS}
    what["runs_root"] = str(runs_root)
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


# -- the CLI's table --------------------------------------------------------------------------
def _yes(v: Any) -> str:
    return "yes" if v else "no"


def _gpu_row(r: dict) -> str:
    g = _gpus(r)
    if not g:
        return "none" + (f" ({_sec(r, 'gpus').get('error')})" if _sec(r, "gpus").get("error") else "")
    return f"{len(g)} x {g[0].get('name')} ({g[0].get('memory_gb')} GB each)" + \
        (f", driver {_sec(r, 'gpus').get('driver')}" if _sec(r, "gpus").get("driver") else "")


def _cpu_row(r: dict) -> str:
    c = _sec(r, "cpus")
    nodes = c.get("numa_nodes") or {}
    return f"{c.get('node')} on the node, {c.get('task')} for the task; NUMA nodes {len(nodes)} " + \
        " ".join(f"[{k}: {v}]" for k, v in sorted(nodes.items()))


def _nsys_row(r: dict) -> str:
    n = _sec(r, "nsys")
    if n.get("off"):
        return "off (cluster.nsys)"
    if not n.get("path"):
        return f"{n.get('binary')}: not found"
    return f"{n.get('version')} at {n.get('path')}, nsys recipe: {_yes(n.get('recipe'))}"


def _runs_row(r: dict) -> str:
    expected, seen = _token(r)
    return "same folder (token read back)" if expected is not None and expected == seen else \
        f"NOT the same ({_sec(r, 'runs_folder').get('error') or 'token differs'})"


def _section_row(key: str, present: str, absent: Callable[[dict], str],
                 found: Callable[[dict], str]) -> Callable[[dict], str]:
    """The row of a section whose `present` field says the thing was found: `found` of the
    section when it was, else `absent` of it."""
    return lambda r: found(_sec(r, key)) if _sec(r, key).get(present) else absent(_sec(r, key))


def _lib_row(key: str) -> Callable[[dict], str]:
    def row(r: dict) -> str:
        s = _sec(r, key)
        return (f"yes {s.get('version') or ''}".strip() if s.get("importable")
                else f"no ({s.get('error') or r.get('error')})")
    return row


SUMMARY: tuple[tuple[str, Callable[[dict], str]], ...] = (
    ("host", lambda r: f"{_host(r)} (job {_sec(r, 'job').get('job_id')}, {_sec(r, 'job').get('state')})"),
    ("python", lambda r: f"{_sec(r, 'python').get('version')} ({_sec(r, 'python').get('executable')})"),
    ("megatron", _section_row(
        "megatron", "megatron_core", lambda m: f"not usable: {m.get('entry')}",
        lambda m: f"megatron-core {m['megatron_core']} from {m.get('megatron_from') or '?'}, api "
                  f"{m.get('api') or '?'}, entry {m.get('entry')}")),
    ("torch", lambda r: (f"{_sec(r, 'torch').get('version')}, CUDA {_sec(r, 'torch').get('cuda')}, "
                         f"GPU usable {_yes(_sec(r, 'torch').get('cuda_available'))}")
     if _sec(r, "torch").get("version") else f"no ({_sec(r, 'torch').get('error') or r.get('error')})"),
    ("GPUs", _gpu_row),
    ("Transformer Engine", _lib_row("transformer_engine")),
    ("apex", _lib_row("apex")),
    ("DeepEP", _section_row(
        "deep_ep", "importable", lambda d: f"no ({d.get('error')})",
        lambda d: f"yes, HybridEP {_yes(d.get('hybrid_ep'))}, built with NVSHMEM "
                  f"{'?' if d.get('nvshmem_built') is None else _yes(d.get('nvshmem_built'))}")),
    ("NVSHMEM", lambda r: ", ".join(_sec(r, "nvshmem").get("libraries") or []) or "no library found"),
    ("IBGDA", _section_row(
        "driver_params", "source", lambda d: "no NVIDIA driver parameters readable",
        lambda d: f"EnableStreamMemOPs {d.get('EnableStreamMemOPs')}, PeerMappingOverride "
                  f"{_yes(d.get('peer_mapping_override'))}, GDRCopy {_yes(d.get('gdrdrv'))}")),
    ("nsys", _nsys_row),
    ("CPUs", _cpu_row),
    ("InfiniBand", lambda r: ", ".join(r.get("infiniband") or []) or "none"),
    ("runs folder", _runs_row),
)


def summary_rows(record: dict) -> list[tuple[str, str]]:
    if not _ran(record):
        return [("job", str(record.get("job_error") or "no record"))]
    return [(what, fn(record)) for what, fn in SUMMARY]
