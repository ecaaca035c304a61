"""A trial's job scripts from the Jinja2 templates in `sbatch_templates/`.

`job_spec(...)` gathers what a job needs (resources, launch command, environment, the nsys line)
from the trial config and the experiment's `cluster` section; `render_job(spec)` turns it into
`job.sbatch` (submit with plain `sbatch`) and `job.sh` (what the job runs, also what submitit
runs). Every value reaches the shell through `shlex.quote` (the environment's `finalize`), so a
model name or path with spaces, quotes or `$(...)` stays one literal word.

The cluster section is validated by the schema (experiment/schema.py `Cluster`), which holds every
default once; a stored section of an older study is read through the same model.
"""
from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from moetune.errors import MoetuneError
from moetune.experiment import gpus
from moetune.experiment.environment import config_env
from moetune.experiment.schema import Cluster, cluster_section
from moetune.job import oci
from moetune.job.paths import TrialPaths
from moetune.paths import TEMPLATES, write_whole
from moetune.paths import WORKLOADS as WORKLOAD_DIR

TEMPLATE_FILES = {"venv": "venv.sh.j2", "container": "container.sh.j2", "oci": "oci.sh.j2"}
# Each workload is one self-contained script (stdlib, torch, megatron-core): the job runs it by
# its path, so the image needs no moetune installed, only the file system the login node shares.
WORKLOADS = {"megatron": WORKLOAD_DIR / "train_moe.py", "cpu_stand_in": WORKLOAD_DIR / "cpu_workload.py"}

# nsys trace types and capture: GPU training records CUDA + NVTX inside the capture range the
# training opens (cudaProfilerStart/Stop around the profiled steps); the CPU stand-in has no CUDA
# and no capture range, only NVTX. `-s none`: no CPU sampling (a short run made a 2 GB report
# with it, on the GPU machine).
NSYS_MODES = {
    # --cuda-graph-trace=node: each kernel of a CUDA graph in the kernel table. Traced as whole
    # graphs (nsys's default) they are missing from it, so a graphed trial's busy time and kernel
    # times leave the graphs out (the analysis warns: moetune/analysis/load.py graphs_traced_whole)
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
    workdir: str  # where the launch runs
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
    exclusive: bool = False
    gres: str | None = None
    wckey: str | None = None
    cpu_bind: str = "none"  # numa: each rank on the CPUs and memory of its share of NUMA nodes
    container_image: str | None = None
    container_bundle: str | None = None  # template "oci": the image's OCI bundle (job/oci.py)
    container_mounts: tuple[str, ...] = ()
    container_writable: bool = False
    modules: tuple[str, ...] = ()
    venv: str | None = None
    megatron_path: str | None = None  # first on the rank's PYTHONPATH, inside the image
    workload_dir: str = str(WORKLOAD_DIR)  # mounted into a container: the workload runs by its path
    # a fit (experiment/fit.py): these ranks of a world of fit_world, one after another on one GPU
    fit_ranks: tuple[int, ...] = ()
    fit_world: int = 0

    @property
    def ntasks(self) -> int:
        return self.nodes * self.ntasks_per_node

    @property
    def paths(self) -> TrialPaths:
        return TrialPaths(self.folder)

    @property
    def log(self) -> str:
        return str(self.paths.log)

    @property
    def container_env(self) -> tuple[str, ...]:
        """The variables a rank gets from the job, the one list both container templates pass in
        (pyxis: --container-env, where the image's own value would win otherwise; Slurm's OCI
        runtime: srun --export): the config's and the cluster's, the rendezvous, and RANK for a
        fit (its ranks are named by it)."""
        names = [k for k, _ in self.env] + ["MASTER_ADDR", "MASTER_PORT"] + (["RANK"] if self.fit_ranks else [])
        return tuple(dict.fromkeys(names))


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


def exported_env(config: Mapping[str, Any], cluster: Cluster) -> dict[str, str]:
    """The variables the job script exports: what the config needs on this cluster
    (experiment/environment.py) and the cluster's own, which win."""
    env = config_env(config, cluster)
    for k, v in cluster.env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)):
            raise RenderError(f"cluster.env: {k!r} is not a shell variable name")
        env[str(k)] = str(v)
    return env


def cpus_per_rank(cluster: Cluster, ranks_per_node: int, node_cpus: int | None) -> int:
    """cluster.cpus_per_task, else the node's CPUs shared out among its ranks, else what a rank
    gets on the GPU's reference node (experiment/gpus.py): one CPU per rank would leave the data-loader
    workers, NCCL's proxy threads and nsys to fight over it, and the GPU's idle time would read
    as a host-overhead wall."""
    if cluster.cpus_per_task:
        return cluster.cpus_per_task
    if node_cpus:
        return max(1, node_cpus // max(1, ranks_per_node))
    if cluster.workload == "megatron":
        return gpus.cpus_per_gpu(cluster.gpu_type) or 1
    return 1


def job_spec(*, name: str, folder: Path, config: Mapping[str, Any], argv: list[str], cluster: Any,
             launcher: str = "srun", fit: tuple[tuple[int, ...], int] | None = None,
             profile: bool = False, node_cpus: int | None = None) -> JobSpec:
    """Everything one trial's job needs. `argv`: the Megatron argv (TrainingConfig.to_args).
    `fit`: (ranks, world size): the job runs those ranks one after another on one GPU of one node
    (experiment/fit.py); profiled only with `profile` (a one-GPU trial; a fit measures memory alone).
    `node_cpus`: CPUs of one compute node (the preflight's record, else Slurm's), shared out among
    its ranks where cluster.cpus_per_task is not set."""
    c = cluster_section(cluster)
    if c.template == "container" and not c.container_image:
        raise RenderError("cluster.container_image is required by template 'container'")
    if c.template == "oci" and not c.container_bundle:
        raise RenderError("cluster.container_bundle is required by template 'oci'")
    if c.template in ("container", "oci") and launcher != "srun":
        raise RenderError(f"cluster.template {c.template!r} needs Slurm (srun); use 'venv' locally")
    node_gpus = 0 if c.workload == "cpu_stand_in" else c.gpus_per_node
    tasks = c.ntasks_per_node or node_gpus or 1
    nodes = c.nodes
    # a fit's rank gets what one rank of the layout gets: its share of the node's CPUs
    cpus = cpus_per_rank(c, tasks, node_cpus)
    if fit:
        nodes, tasks, node_gpus = 1, 1, min(node_gpus, 1)
    # the interpreter of the container or of cluster.venv; with neither, the one running moetune
    own_python = c.template == "venv" and not c.venv
    python = c.python or (sys.executable if own_python else "python")
    command = [python, "-u", str(WORKLOADS[c.workload]), *argv]
    if c.workload == "cpu_stand_in":
        for key in ("ms_per_iter", "busy", "alloc_mb", "model_mb", "refuse", "slow_ranks"):
            if key in c.stand_in:  # =: a value may start with --
                command.append(f"--stand-in-{key.replace('_', '-')}={c.stand_in[key]}")
    folder = str(Path(folder).resolve())
    # a fit's ranks are named by RANK, which its launch sets (srun's SLURM_PROCID is 0 for each)
    rank_var = "SLURM_PROCID" if launcher == "srun" and not fit else "RANK"
    ranks = tuple(int(r) for r in c.profile_ranks)  # ranks a job lacks never match
    if fit:  # the ranks it runs that the cluster profiles, else its first
        ranks = tuple(r for r in fit[0] if r in ranks) or tuple(fit[0][:1])
    nsys = None
    if c.nsys not in ("", "off") and (profile or not fit):
        # nsys expands %q{VAR} in -o; a literal % is %%
        before, after = TrialPaths.around_rank(TrialPaths(folder).trace)
        output = before.replace("%", "%%") + f"%q{{{rank_var}}}" + after.replace("%", "%%")
        nsys = NsysSpec(binary=c.nsys, options=NSYS_MODES[c.workload], ranks=ranks, output=output)
    return JobSpec(
        name=name, folder=folder, workdir=c.workdir or str(Path.cwd()), template=c.template,
        launcher=launcher, nodes=nodes, ntasks_per_node=tasks, gpus_per_node=node_gpus,
        cpus_per_task=cpus, mem=c.mem, time_min=time_minutes(c.time_limit),
        partition=c.partition, account=c.account, command=tuple(command),
        env=tuple(sorted(exported_env(config, c).items())), nsys=nsys,
        exclusive=c.exclusive and launcher == "srun", gres=c.gres, wckey=c.wckey, cpu_bind=c.cpu_bind,
        container_image=c.container_image, container_bundle=c.container_bundle,
        container_mounts=tuple(c.container_mounts),
        container_writable=c.container_writable, modules=tuple(c.modules), venv=c.venv,
        megatron_path=c.megatron_path,
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
    env.globals.update(oci_bundle=oci.bundle)
    return env


# per-rank files a job script names with its shell's rank (TrialPaths' method of each)
SCRIPT_RANK_FILES = ("rank_log", "report", "qdstrm", "sqlite", "nsys_version")


def render_context(spec: JobSpec) -> dict:
    """What the templates see: the spec, the folder's file names (`paths`), and each per-rank
    file split where the shell's rank goes (`at_rank.report` = (before, after))."""
    paths = spec.paths
    return {"spec": spec, "paths": paths,
            "at_rank": {k: TrialPaths.around_rank(getattr(paths, k)) for k in SCRIPT_RANK_FILES}}


def render_job(spec: JobSpec) -> dict[str, str]:
    """{file name: text} of the job's two scripts: job.sbatch and job.sh (TrialPaths)."""
    env = environment()
    paths = spec.paths
    try:
        names = render_context(spec)
        return {paths.sbatch.name: env.get_template("sbatch.j2").render(**names),
                paths.job_script.name: env.get_template(TEMPLATE_FILES[spec.template]).render(**names)}
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
        write_whole(path, text, mode=0o755)
        out.append(path)
    return out


def template_texts() -> str:
    """All template sources, for the render stage's input hash (a changed template re-renders)."""
    return "".join(p.read_text() for p in sorted(TEMPLATES.glob("*.j2")))
