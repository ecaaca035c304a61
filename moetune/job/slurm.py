"""The one client of Slurm's commands: no other module of moetune runs sbatch, sacct, squeue,
scancel or sinfo (tests/job/test_slurm.py holds every module to that). What the states mean for a
trial is job/scheduler.py's business; this module only asks and answers in Slurm's words.

    available()                  -> whether Slurm is here (sbatch and sacct on PATH): the one rule
    WATCHER.rows(job_id)         -> sacct's rows of the job and its steps (one batched, cached sacct)
    job_nodes(rows, job_id)      -> the job's allocation (all its nodes) from those rows
    hostnames(nodelist)          -> 'n[1-2],g01' -> ['n1', 'n2', 'g01'] (scontrol show hostnames)
    queue(job_id, array=False)   -> [(state, reason)] as squeue has them now
    find_job(name)               -> id of the newest job of that name
    sbatch_command(options)      -> the sbatch command line of a job;  sbatch(options) -> job id
    cancel(job_id)               -> scancel
    node_cpus(partition)         -> CPUs of the partition's smallest node (sinfo)
"""
from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time

from moetune.errors import MoetuneError

TIMEOUT_S = 60

# States of a job that is still the scheduler's business.
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                    "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT",
                    "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT", "UNKNOWN"})
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Submit", "Start", "End", "Elapsed",
                "NodeList", "Reason", "ElapsedRaw", "NNodes")


class JobError(MoetuneError):
    """A job could not be submitted or looked up (one line, says what to do)."""


def available() -> bool:
    """Whether jobs can go to Slurm here: sbatch to submit and sacct to follow them."""
    return shutil.which("sbatch") is not None and shutil.which("sacct") is not None


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=TIMEOUT_S).stdout
    except FileNotFoundError:
        raise JobError(f"{cmd[0]} not found: is Slurm installed here (scripts/slurm-up)?") from None
    except subprocess.CalledProcessError as e:
        raise JobError(f"{' '.join(cmd[:2])} failed: {e.stderr.strip()[:200]}") from None
    except subprocess.TimeoutExpired:
        raise JobError(f"{' '.join(cmd[:2])} did not answer in {TIMEOUT_S} s (slurmctld/slurmdbd down?)") from None


def base_id(job_id: str) -> str:
    """The job a row of sacct belongs to: '123' of '123', '123.batch', '123_4', '123_[0-3]'."""
    m = re.match(r"\d+", job_id)
    return m.group(0) if m else job_id


def allocations(rows: list[dict]) -> list[dict]:
    """A job's own rows (an array's elements), not its steps' (what `sacct -X` shows)."""
    return [r for r in rows if "." not in r["JobID"]]


def hostnames(nodelist: str | None) -> list[str]:
    """The node names of a Slurm host list, in its order: 'n[1-2,5],gpu[08-09]' -> n1 n2 n5
    gpu08 gpu09 (zero padding kept, as `scontrol show hostnames`); [] for none ('None assigned')."""
    if not nodelist or nodelist in ("None assigned", "Unknown", "None", "N/A"):
        return []
    items, depth, start = [], 0, 0
    for i, c in enumerate(nodelist):  # split at the commas outside brackets
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    items.append(nodelist[start:])
    names: list[str] = []
    for item in filter(None, (x.strip() for x in items)):
        m = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", item)
        if not m:
            names.append(item)
            continue
        head, ranges, tail = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for k in range(int(lo), int(hi or lo) + 1):
                names.extend(head + str(k).zfill(len(lo)) + t for t in hostnames(tail) or [tail])
    return names


def _nnodes(row: dict) -> int | None:
    value = (row.get("NNodes") or "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def nodes_recorded(row: dict) -> bool:
    """Whether an allocation's row names all the nodes it counts (NNodes). It does not while
    slurmdbd has recorded the job only from its batch step's record: under load the step's start
    can reach slurmdbd before the job's own, and the job's row is then created with the batch
    step's node list (the first node only) and keeps it, even once COMPLETED with NNodes 2, until
    the job's own start record comes (seen on Slurm 22.05: `1166|COMPLETED|n1|2|...`, a second
    later `n[1-2]`). Rows without a node list or without a count have nothing to check."""
    names, count = hostnames(row.get("NodeList")), _nnodes(row)
    return not names or count is None or len(names) >= count


def job_nodes(rows: list[dict], job_id: str | int) -> str | None:
    """The job's allocation, all its nodes, from sacct's rows of it and its steps: its own row's
    NodeList where that names every node it counts; else (accounting has the job only from its
    batch step so far, nodes_recorded) the nodes of its row and of all its steps together, which
    all ran inside the allocation, as a comma list in first-seen order; None where no row names
    a node."""
    job_id = str(job_id)
    own = [r for r in rows if r["JobID"] == job_id]
    if not own:
        return None
    row = own[-1]
    if nodes_recorded(row):
        names = hostnames(row.get("NodeList"))
        return row["NodeList"] if names else None
    seen: list[str] = []
    for r in [row] + [s for s in rows if s["JobID"].startswith(f"{job_id}.")]:
        seen.extend(n for n in hostnames(r.get("NodeList")) if n not in seen)
    return ",".join(seen) or None


def ended(rows: list[dict]) -> bool:
    """Every allocation accounting knows has left the scheduler's hands (none pending as a range)."""
    alloc = allocations(rows)
    return bool(alloc) and all("[" not in r["JobID"] and (r["State"].split() or ["UNKNOWN"])[0] not in ACTIVE
                               for r in alloc)


class SacctWatcher:
    """One `sacct` answers for every job being followed: a lookup within `delay_s` of the last
    call reads the cache, and a call asks about all watched jobs at once, so polling many jobs (a
    study's trials and their post-processing arrays) costs slurmdbd one query, not one a job. A
    job asked about for the first time is asked at once. A job drops out of the query once it has
    ended, until someone asks about it again (an array whose late elements accounting has not
    seen yet is asked again by the caller that counts them)."""

    def __init__(self, delay_s: float = 1.0, clock=time.monotonic):
        self.delay_s, self._clock = delay_s, clock
        self._watched: set[str] = set()
        self._rows: dict[str, list[dict]] = {}
        self._asked_at = float("-inf")
        self._lock = threading.Lock()
        self.calls = 0  # sacct runs, for the record (and the tests)

    def rows(self, job_id: str | int) -> list[dict]:
        """sacct's rows of the job, its array elements and its steps (SACCT_FIELDS), at most
        `delay_s` old; [] where accounting has no record of it yet. JobError where sacct fails."""
        job_id = str(job_id)
        with self._lock:
            self._watched.add(job_id)
            if job_id not in self._rows or self._clock() - self._asked_at >= self.delay_s:
                self._update()
            return list(self._rows.get(job_id, []))

    def _update(self) -> None:
        ids = sorted(self._watched, key=lambda j: (len(j), j))
        out = _run(["sacct", "-n", "-P", "-j", ",".join(ids), "-o", ",".join(SACCT_FIELDS)])
        self.calls += 1
        found: dict[str, list[dict]] = {j: [] for j in ids}
        for line in out.splitlines():
            if line.strip():
                row = dict(zip(SACCT_FIELDS, line.split("|"), strict=False))
                found.setdefault(base_id(row["JobID"]), []).append(row)
        self._rows.update({j: found[j] for j in ids})
        # an ended job whose row does not name all its nodes yet is asked again (nodes_recorded)
        self._watched -= {j for j in ids
                          if ended(found[j]) and all(map(nodes_recorded, allocations(found[j])))}
        self._asked_at = self._clock()

    def clear(self) -> None:
        with self._lock:
            self._watched.clear()
            self._rows.clear()
            self._asked_at = float("-inf")


WATCHER = SacctWatcher()


def queue(job_id: str | int, array: bool = False) -> list[tuple[str, str]]:
    """[(state, reason)] of the job as the queue has it now (`array`: one an element); [] where
    squeue does not know it (any more) or does not answer."""
    cmd = ["squeue", "-h", *(["-r"] if array else []), "-j", str(job_id), "-o", "%T|%R"]
    try:
        out = _run(cmd)
    except JobError:
        return []
    rows = [line.strip().partition("|") for line in out.splitlines() if line.strip()]
    return [(state, reason) for state, _, reason in rows]


def find_job(name: str) -> str | None:
    """Id of the newest job of this name that Slurm knows (a submit whose id was never stored)."""
    out = _run(["sacct", "-X", "-n", "-P", "--name", name, "-S", "now-30days", "-o", "JobID"])
    ids = [line.strip() for line in out.splitlines() if line.strip().isdigit()]
    if not ids:
        out = _run(["squeue", "-h", "--name", name, "-o", "%i"])
        ids = [line.strip() for line in out.splitlines() if line.strip().isdigit()]
    return max(ids, key=int) if ids else None


def sbatch_command(options: list[str]) -> list[str]:
    """The command line that submits a job of these sbatch options and prints only its id."""
    return ["sbatch", "--parsable", *options]


def sbatch(options: list[str], retry_without_dependency: bool = False) -> str:
    """Submit a job (sbatch_command(options)); its id. `retry_without_dependency`: where Slurm
    refuses the --dependency (the job it names ended so long ago that slurmctld forgot it), submit
    without it, as there is nothing left to wait for. JobError with sbatch's line where it fails."""
    cmd = sbatch_command(options)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        if r.returncode and retry_without_dependency and "dependency" in (r.stderr or "").lower():
            r = subprocess.run([c for c in cmd if not c.startswith("--dependency=")],
                               capture_output=True, text=True, timeout=TIMEOUT_S)
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        raise JobError(str(e)) from None
    if r.returncode:
        raise JobError((r.stderr or r.stdout).strip()[:200])
    return r.stdout.strip().split(";")[0]


def cancel(job_id: str | int, quiet: bool = False) -> None:
    """scancel the job; `quiet`: best effort, no error where Slurm does not answer."""
    try:
        _run(["scancel", str(job_id)])
    except JobError:
        if not quiet:
            raise


def node_cpus(partition: str | None = None) -> int | None:
    """CPUs of the partition's smallest node, as Slurm knows them (`sinfo %c`); None where Slurm
    does not answer."""
    cmd = ["sinfo", "-h", "-o", "%c"] + ([f"--partition={partition}"] if partition else [])
    try:
        found = [int(x) for x in _run(cmd).split() if x.isdigit()]
    except JobError:
        return None
    return min(found) if found else None
