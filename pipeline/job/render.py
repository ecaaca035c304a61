"""A trial's job scripts from the Jinja2 templates in `sbatch_templates/`.

`job_spec(...)` gathers what a job needs (resources, launch command, environment, the nsys line)
from the trial config and the experiment's `cluster` section; `render_job(spec)` turns it into
`job.sbatch` (submit with plain `sbatch`) and `job.sh` (what the job runs, also what submitit
runs). Every value reaches the shell through `shlex.quote` (the environment's `finalize`), so a
model name or path with spaces, quotes or `$(...)` stays one literal word.

Cluster keys read (all optional): template (venv|container|oci), nodes, gpus_per_node,
ntasks_per_node, cpus_per_task, mem (or mem_per_node), time_limit ("HH:MM:SS", "MM:SS" or minutes), partition,
account, container_image, container_bundle, container_mounts, modules, venv, env, nsys, profile_ranks,
workload (megatron|cpu_stand_in), stand_in ({ms_per_iter, busy, alloc_mb, model_mb, refuse}), python.
"""
from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import jinja2

from moetune.pipeline.errors import MoetuneError
from moetune.pipeline.job import oci
from moetune.pipeline.paths import TEMPLATES, WORKLOADS as WORKLOAD_DIR
from moetune.pipeline.spec.environment import config_env
from moetune.pipeline.spec.section import get as _get

TEMPLATE_FILES = {"venv": "venv.sh.j2", "container": "container.sh.j2", "oci": "oci.sh.j2"}
# Each workload is one self-contained script (stdlib, torch, megatron-core): the job runs it by
# its path, so the image needs no moetune installed, only the file system the login node shares.
WORKLOADS = {"megatron": WORKLOAD_DIR / "train_moe.py", "cpu_stand_in": WORKLOAD_DIR / "cpu_workload.py"}

# nsys trace types and capture: GPU training records CUDA + NVTX inside the capture range the
# training opens (cudaProfilerStart/Stop around the profiled steps); the CPU stand-in has no CUDA
# and no capture range, only NVTX. `-s none`: no CPU sampling (a short run made a 2 GB report
# with it, ../shared/device-notes.md).
NSYS_MODES = {
    # --cuda-graph-trace=node: each kernel of a CUDA graph in the kernel table. Traced as whole
    # graphs (nsys's default) they are missing from it, so a graphed trial's busy time and kernel
    # times leave the graphs out (the analysis warns: analysis/load.py graphs_traced_whole)
    "megatron": ("-t", "cuda,nvtx", "-s", "none", "--cpuctxsw=none", "--cuda-graph-trace=node",
                 "--capture-range=cudaProfilerApi", "--capture-range-end=stop"),
    "cpu_stand_in": ("-t", "nvtx", "-s", "none", "--cpuctxsw=none"),
}

class RenderError(MoetuneError):
    """A job script cannot be rendered from these values (one line, names the key)."""


@dataclass(frozen=True)
class NsysSpec:
    binary: str
    options: tuple[str, ...]
    ranks: tuple[int, ...]
    output: str  # with %q{RANKVAR}; % in the folder doubled


@dataclass(frozen=True)
class JobSpec:
    name: str
    folder: str  # the trial folder, absolute
    workdir: str  # where the launch runs (the repository)
    template: str
    launcher: str  # srun | local
    nodes: int
    ntasks_per_node: int
    gpus_per_node: int
    cpus_per_task: int
    mem: str | None
    time_min: int
    partition: str | None
    account: str | None
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    nsys: NsysSpec | None
    container_image: str | None = None
    container_bundle: str | None = None  # template "oci": the image's OCI bundle (job/oci.py)
    container_mounts: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    venv: str | None = None
    workload_dir: str = str(WORKLOAD_DIR)  # mounted into a container: the workload runs by its path
    # a fit (spec/fit.py): these ranks of a world of fit_world, one after another on one GPU
    fit_ranks: tuple[int, ...] = ()
    fit_world: int = 0

    @property
    def ntasks(self) -> int:
        return self.nodes * self.ntasks_per_node

    @property
    def log(self) -> str:
        return f"{self.folder}/log.txt"


def time_minutes(value: Any) -> int:
    """Slurm time "HH:MM:SS", "MM:SS", "D-HH:MM:SS" or whole minutes → minutes (at least 1)."""
    if isinstance(value, (int, float)):
        return max(1, int(value))
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", str(value).strip())
    if not m:
        raise RenderError(f"cluster.time_limit {value!r}: use minutes or HH:MM:SS")
    d, a, b, c = (int(x) if x else None for x in m.groups())
    if c is not None:  # H:M:S
        secs = a * 3600 + b * 60 + c
    elif b is not None:  # M:S
        secs = a * 60 + b
    else:
        secs = a * 60
    secs += (d or 0) * 86400
    return max(1, -(-secs // 60))


def job_env(config: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """What the config needs (spec/environment.py) and the cluster's own variables."""
    env = config_env(config)
    for k, v in (extra or {}).items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)):
            raise RenderError(f"cluster.env: {k!r} is not a shell variable name")
        env[str(k)] = str(v)
    return env


def job_spec(*, name: str, folder: Path, config: Mapping[str, Any], argv: list[str], cluster: Any,
             launcher: str = "srun", fit: tuple[tuple[int, ...], int] | None = None,
             profile: bool = False) -> JobSpec:
    """Everything one trial's job needs. `argv`: the Megatron argv (TrainingConfig.to_args).
    `fit`: (ranks, world size): the job runs those ranks one after another on one GPU of one node
    (spec/fit.py); profiled only with `profile` (a one-GPU trial; a fit measures memory alone)."""
    template = str(_get(cluster, "template", "venv"))
    if template not in TEMPLATE_FILES:
        raise RenderError(f"cluster.template {template!r}: allowed {sorted(TEMPLATE_FILES)}")
    workload = str(_get(cluster, "workload", "megatron"))
    if workload not in WORKLOADS:
        raise RenderError(f"cluster.workload {workload!r}: allowed {sorted(WORKLOADS)}")
    if template == "container" and not _get(cluster, "container_image"):
        raise RenderError("cluster.container_image is required by template 'container'")
    if template == "oci" and not _get(cluster, "container_bundle"):
        raise RenderError("cluster.container_bundle is required by template 'oci'")
    if template in ("container", "oci") and launcher != "srun":
        raise RenderError(f"cluster.template {template!r} needs Slurm (srun); use 'venv' locally")
    gpus = int(_get(cluster, "gpus_per_node", 0))
    if workload == "cpu_stand_in":
        gpus = 0
    tasks = int(_get(cluster, "ntasks_per_node", gpus or 1))
    nodes = int(_get(cluster, "nodes", 1))
    if fit:
        nodes, tasks, gpus = 1, 1, min(gpus, 1)
    # the interpreter of the container or of cluster.venv; with neither, the one running moetune
    own_python = template == "venv" and not _get(cluster, "venv")
    python = str(_get(cluster, "python", sys.executable if own_python else "python"))
    command = [python, "-u", str(WORKLOADS[workload]), *argv]
    if workload == "cpu_stand_in":
        s = _get(cluster, "stand_in", {}) or {}
        for key in ("ms_per_iter", "busy", "alloc_mb", "model_mb", "refuse"):
            if key in s:
                command.append(f"--stand-in-{key.replace('_', '-')}={s[key]}")  # =: a value may start with --
    folder = str(Path(folder).resolve())
    # a fit's ranks are named by RANK, which its launch sets (srun's SLURM_PROCID is 0 for each)
    rank_var = "SLURM_PROCID" if launcher == "srun" and not fit else "RANK"
    ranks = tuple(int(r) for r in _get(cluster, "profile_ranks", [0, 1]))  # ranks a job lacks never match
    if fit:  # the ranks it runs that the cluster profiles, else its first
        ranks = tuple(r for r in fit[0] if r in ranks) or tuple(fit[0][:1])
    nsys = None
    if _get(cluster, "nsys", "nsys") not in ("", "off", False) and (profile or not fit):
        nsys = NsysSpec(binary=str(_get(cluster, "nsys", "nsys")), options=NSYS_MODES[workload],
                        ranks=ranks,
                        output=folder.replace("%", "%%") + f"/trace_%q{{{rank_var}}}")
    venv = _get(cluster, "venv")
    return JobSpec(
        name=name, folder=folder, workdir=str(_get(cluster, "workdir", Path.cwd())), template=template,
        launcher=launcher, nodes=nodes, ntasks_per_node=tasks,
        gpus_per_node=gpus, cpus_per_task=int(_get(cluster, "cpus_per_task", 1)),
        mem=_get(cluster, "mem", _get(cluster, "mem_per_node")), time_min=time_minutes(_get(cluster, "time_limit", 30)),
        partition=_get(cluster, "partition"), account=_get(cluster, "account"),
        command=tuple(command), env=tuple(sorted(job_env(config, _get(cluster, "env", {})).items())),
        nsys=nsys, container_image=_get(cluster, "container_image"),
        container_bundle=_get(cluster, "container_bundle"),
        container_mounts=tuple(_get(cluster, "container_mounts", ())),
        modules=tuple(_get(cluster, "modules", ())), venv=str(venv) if venv else None,
        fit_ranks=tuple(fit[0]) if fit else (), fit_world=int(fit[1]) if fit else 0)


def shell_word(value: Any) -> str:
    """Every `{{ value }}` in a template: one shell word. Newlines and NULs are refused, since a
    `#SBATCH` line would end at the newline and the rest would run as shell."""
    if value is None:
        return "''"
    text = str(value)
    if "\n" in text or "\r" in text or "\0" in text:
        raise RenderError(f"value {text[:40]!r}... holds a newline or NUL; not allowed in a job script")
    return shlex.quote(text)


def slurm_filename(path: str) -> str:
    """Slurm expands %j etc. in --output; a literal % is %%."""
    return path.replace("%", "%%")


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), finalize=shell_word,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["slurm_filename"] = slurm_filename
    env.globals.update(oci_bundle=oci.bundle, oci_passed_names=oci.passed_names)
    return env


def render_job(spec: JobSpec) -> dict[str, str]:
    """{"job.sbatch": text, "job.sh": text}."""
    env = environment()
    try:
        return {"job.sbatch": env.get_template("sbatch.j2").render(spec=spec),
                "job.sh": env.get_template(TEMPLATE_FILES[spec.template]).render(spec=spec)}
    except jinja2.TemplateError as e:
        raise RenderError(f"{TEMPLATES}: {e}") from None
    except oci.OciError as e:
        raise RenderError(str(e)) from None


def write_job(spec: JobSpec) -> list[Path]:
    folder = Path(spec.folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in render_job(spec).items():
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
        out.append(path)
    return out


def template_texts() -> str:
    """All template sources, for the render stage's input hash (a changed template re-renders)."""
    return "".join(p.read_text() for p in sorted(TEMPLATES.glob("*.j2")))
