"""Every file name in a trial folder, in one place. The stages, the job script (through its render
context), the post-processing job, the report and `moetune render` ask `TrialPaths` for a file
instead of spelling its name; submitit's files stay submitit's (`JobPaths`, inside `submitit/`).

A per-rank file's method takes the rank; given "*" it is the glob of every rank's file
(`each`), given `RANK_HOLE` it is split where a job script puts its shell's rank (`around_rank`).
Two names have their home in `moetune.analysis`, which imports nothing of the pipeline: a
profiled rank's report `trace_<R>` (analysis.ranks, which reads the rank back from it) and its
summary `trace_<R>.metrics.json` (analysis.summary.summary_path).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moetune.analysis.ranks import RANK_IN_NAME, REPORT_PREFIX
from moetune.analysis.summary import summary_path

RANK_HOLE = "\0"  # no path holds a NUL: where a job script's shell puts the rank


@dataclass(frozen=True)
class TrialPaths:
    folder: Path

    def __post_init__(self):
        object.__setattr__(self, "folder", Path(self.folder))

    def _at(self, name: str) -> Path:
        return self.folder / name

    # -- render: the job and what it was made from
    @property
    def sbatch(self) -> Path:
        """The job for plain `sbatch` (moetune submits job.sh through submitit instead)."""
        return self._at("job.sbatch")

    @property
    def job_script(self) -> Path:
        return self._at("job.sh")

    @property
    def spec(self) -> Path:
        return self._at("spec.json")

    @property
    def config(self) -> Path:
        return self._at("config.json")

    @property
    def command(self) -> Path:
        return self._at("command.txt")

    @property
    def one_gpu_rank(self) -> Path:
        """The rank a one-GPU trial ran alone, and why."""
        return self._at("one_gpu_rank.json")

    @property
    def bundle(self) -> Path:
        """Template "oci": the trial's own OCI bundle (job/oci.py)."""
        return self._at("bundle")

    @property
    def ranks_conf(self) -> Path:
        """Template "oci": srun --multi-prog's table, one line for every rank."""
        return self._at("ranks.conf")

    @property
    def export_script(self) -> Path:
        """`moetune render`'s post-processing job, sbatch'ed by hand after the trial's."""
        return self._at("export.sh")

    # -- submit and collect
    @property
    def job(self) -> Path:
        """The submitted job: its id, executor kind, submitit folder and name."""
        return self._at("job.json")

    @property
    def submitit(self) -> Path:
        """submitit's folder; the names inside are its own (scheduler.JobRef.paths)."""
        return self._at("submitit")

    @property
    def local_controller_log(self) -> Path:
        """The local executor's controller's own stderr (submitit's process that watches the job;
        its traceback on Ctrl-C lands here, not on the console)."""
        return self._at("local_controller.err")

    def previous(self, job_id: str) -> Path:
        """A forced re-submit sets the earlier attempt's files aside here."""
        return self._at(f"previous/{job_id}")

    @property
    def log(self) -> Path:
        """The job's output, every rank's lines."""
        return self._at("log.txt")

    def rank_log(self, rank) -> Path:
        """A fit's rank's own output (its ranks run one after another)."""
        return self._at(f"log_rank_{rank}.txt")

    def stand_in_rank(self, rank) -> Path:
        """What the CPU stand-in's rank saw (workloads/cpu_workload.py writes it: a workload runs by its
        path in the job, without moetune, so it spells this name itself)."""
        return self._at(f"rank_{rank}.json")

    @property
    def state(self) -> Path:
        """The job's end as the scheduler reports it."""
        return self._at("state.json")

    # -- a profiled rank's report and what is made from it
    def trace(self, rank) -> Path:
        """The report's path without its suffix: nsys profile -o names it so."""
        return self._at(f"{REPORT_PREFIX}{rank}")

    def _trace_as(self, rank, suffix: str) -> Path:
        return self.trace(rank).with_name(self.trace(rank).name + suffix)

    def report(self, rank) -> Path:
        return self._trace_as(rank, ".nsys-rep")

    def qdstrm(self, rank) -> Path:
        """A bare capture, where nsys could not run its importer in the job."""
        return self._trace_as(rank, ".qdstrm")

    def sqlite(self, rank) -> Path:
        return self._trace_as(rank, ".sqlite")

    def nsys_version(self, rank) -> Path:
        """The version of the nsys that recorded the report (an older one cannot open it)."""
        return self._trace_as(rank, ".nsys-version")

    def metrics(self, rank) -> Path:
        """The rank's summary (analysis.summary), what the login node reads instead of the SQLite."""
        return summary_path(self.sqlite(rank))

    def recipes(self, rank) -> Path:
        """NVIDIA's recipes of the report beside moetune's figures (analysis.recipes.check_report)."""
        return self._trace_as(rank, ".recipes.json")

    @property
    def postprocess(self) -> Path:
        """The post-processing job: its id and the trial job it is for."""
        return self._at("postprocess.json")

    def postprocess_out(self, task) -> Path:
        """One post-processing array element's output ("%a": Slurm's own name for each)."""
        return self._at(f"postprocess_{task}.out")

    # -- analyze and decide
    @property
    def analysis(self) -> Path:
        return self._at("analysis.json")

    @property
    def decision(self) -> Path:
        return self._at("decision.json")

    @property
    def timeline(self) -> Path:
        """The per-rank strips of the profiled window the report draws (analysis.timeline)."""
        return self._at("timeline.json")

    @property
    def top_kernels(self) -> Path:
        """The window's longest kernels the report lists (analysis.timeline.top_kernels)."""
        return self._at("top_kernels.json")

    # -- the fit: a job folder of its own inside the trial's
    @property
    def fit(self) -> TrialPaths:
        return TrialPaths(self._at("fit"))

    @property
    def fit_result(self) -> Path:
        """In a fit's folder: each rank's peak and step time, and whether the layout fits."""
        return self._at("fit.json")

    # -- globs and ranks
    def each(self, name_of: Callable[[str], Path]) -> list[Path]:
        """Every rank's file of one kind that is there: each(paths.sqlite)."""
        return sorted(self.folder.glob(name_of("*").name))

    @property
    def reports(self) -> list[Path]:
        """What nsys left of each profiled rank: a report, or a bare capture."""
        return sorted(self.each(self.report) + self.each(self.qdstrm))

    @staticmethod
    def rank_of(path: Path) -> str:
        """The rank a per-rank report's file is named for."""
        m = RANK_IN_NAME.match(Path(path).name)
        if not m:
            raise ValueError(f"{path}: not a profiled rank's file ({REPORT_PREFIX}<rank>.*)")
        return m.group(1)

    @staticmethod
    def around_rank(name_of: Callable[[str], Path]) -> tuple[str, str]:
        """A per-rank path split where the rank goes: (before, after), for a job script to put
        its shell's rank between."""
        before, _, after = str(name_of(RANK_HOLE)).partition(RANK_HOLE)
        return before, after

    def attempt(self) -> list[Path]:
        """What one submission of the trial's job leaves, and a forced re-submit sets aside."""
        return sorted(p for pat in (self.job.name, self.state.name, self.log.name, self.analysis.name,
                                    self.decision.name, self.timeline.name, self.top_kernels.name,
                                    self.trace("*").name,
                                    self.submitit.name, self.postprocess.name,
                                    self.postprocess_out("*").name)
                      for p in self.folder.glob(pat))

    def names(self) -> list[str]:
        """The glob of every name a trial folder (or its fit's) may hold at its top: what a test
        checks a real trial's folder against."""
        per_rank = (self.rank_log, self.stand_in_rank, self.report, self.qdstrm, self.sqlite,
                    self.nsys_version, self.metrics, self.recipes, self.postprocess_out)
        single = (self.sbatch, self.job_script, self.spec, self.config, self.command,
                  self.one_gpu_rank, self.bundle, self.ranks_conf, self.export_script, self.job,
                  self.submitit, self.local_controller_log, self.log, self.state, self.postprocess, self.analysis,
                  self.decision, self.timeline, self.top_kernels, self.fit.folder, self.fit_result,
                  self.previous("*").parent)
        return sorted([p.name for p in single] + [name_of("*").name for name_of in per_rank])
