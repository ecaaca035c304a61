"""Benchmark: what the tuner's process on the login node spends on a study whose trials each bring
several large reports, with the post-processing in that process (`cluster.postprocess.where:
login`) and as a Slurm job after each trial's (`where: job`), which is why the job is the default.

    .venv/bin/python benchmarks/login_node.py [--kernels 1000000] [--ranks 8] [--trials 2]

Each trial brings --ranks reports, each a synthetic --kernels-kernel single-rank SQLite export in the
real nsys schema (benchmarks/analysis.py's generator), hard-linked into the trial folder as
trace_R.sqlite. The trial's own job is a stand-in (`sbatch --wrap 'sleep 1'`): no training runs
here, the reports are already there; a .sqlite report makes the post-processing job skip `nsys
export` (it cannot be synthesised as a .nsys-rep), so its time is the per-rank metrics alone.
Per mode, a fresh child process plays the tuner for all trials, with the functions the trial's
stages call (trial/traces.py do_analyze / _export_as_job):
    login: wait for the trial's job, then analysis.analyze(the trial's reports)
    job:   job/postprocess.submit(..., after=<trial job>), wait for it, then
           analysis.summary.combine_summaries(the trial's trace_R.metrics.json)
and reports its own ru_maxrss and CPU time (its children's too: sacct/sbatch/squeue polls), and the
post-processing jobs' wall time from sacct (first element's start to last element's end).
Writes benchmarks/results/login_node.json and the `## Login node` section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def synthetic_rank(work: Path, kernels: int) -> Path:
    """One rank's export of `kernels` kernels, built once and kept."""
    path = work / f"rank_{kernels}.sqlite"
    if not path.exists():
        spec = importlib.util.spec_from_file_location("bench_analysis", REPO / "benchmarks" / "analysis.py")
        mod = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(REPO))
        spec.loader.exec_module(mod)
        tmp = path.with_suffix(".tmp")
        mod.build(tmp, kernels, 1)
        os.replace(tmp, path)
    return path


def _sbatch(*args: str) -> str:
    return subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True,
                          check=True).stdout.strip().split(";")[0]


def _wait_job(job_id: str) -> None:
    from moetune.job import scheduler as jobs
    jobs.wait(jobs.JobRef(job_id=job_id, kind="slurm", folder="", name=""), poll_s=1.0)


def _elapsed_s(job_id: str) -> float:
    """First element's start to last element's end of a (post-processing) job array."""
    for _ in range(30):  # accounting may lag the end by a moment
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "Start,End"],
                             capture_output=True, text=True).stdout.split()
        rows = [r.split("|") for r in out]
        if rows and all(s not in ("Unknown", "None") and e not in ("Unknown", "None") for s, e in rows):
            fmt = "%Y-%m-%dT%H:%M:%S"
            start = min(datetime.strptime(s, fmt) for s, _ in rows)
            end = max(datetime.strptime(e, fmt) for _, e in rows)
            return (end - start).total_seconds()
        time.sleep(1)
    return float("nan")


def tuner(mode: str, work: Path, report: Path, ranks: int, trials: int, mem: str) -> dict:
    """The tuner's share of post-processing for `trials` trials (this process is measured)."""
    from moetune import analysis
    from moetune.analysis.summary import combine_summaries, load_summary, summary_path
    from moetune.job import postprocess
    imports_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    t0 = time.monotonic()
    walls, results, summary_mb = [], [], None
    for i in range(trials):
        folder = work / mode / f"trial_{i}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        traces = []
        for r in range(ranks):
            dst = folder / f"trace_{r}.sqlite"
            try:
                os.link(report, dst)
            except OSError:
                shutil.copy(report, dst)
            traces.append(dst)
        job = _sbatch(f"--job-name=bench.trial{i}", "--ntasks=1", "--mem=100M", "--time=5",
                      f"--output={folder}/job.out", "--wrap", "sleep 1")
        if mode == "login":
            _wait_job(job)
            result = analysis.analyze([str(p) for p in traces])
        else:
            cluster = {"postprocess": {"mem": mem, "time_limit": "00:20:00"}}
            post = postprocess.submit(folder, list(range(ranks)), cluster, after=job,
                                      name=f"bench.trial{i}.post", python=sys.executable)
            _wait_job(job)
            state = postprocess.wait(post, ranks, timeout_s=1800)
            if state != "COMPLETED":
                raise SystemExit(f"post-processing job {post}: {state}; see {folder}/postprocess_*.out")
            walls.append(_elapsed_s(post))
            summary_mb = round(summary_path(traces[0]).stat().st_size / 2**20, 2)
            result = combine_summaries([load_summary(summary_path(p)) for p in traces])
        (folder / "analysis.json").write_text(json.dumps(result, sort_keys=True, default=str))
        kept = {k: v for k, v in result.items() if k != "sources"}  # the folders differ by mode
        kept["sources"] = [Path(p).name for p in result["sources"]]
        results.append(json.loads(json.dumps(kept, sort_keys=True, default=str)))
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"mode": mode, "peak_rss_mb": round(me.ru_maxrss / 1024, 1), "rss_after_imports_mb": imports_mb,
            "summary_mb": summary_mb,
            "cpu_s": round(me.ru_utime + me.ru_stime, 2),
            "children_cpu_s": round(kids.ru_utime + kids.ru_stime, 2),
            "wall_s": round(time.monotonic() - t0, 1), "postprocess_job_wall_s": walls,
            "analyses": results}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=1_000_000, help="kernels per rank's report")
    ap.add_argument("--ranks", type=int, default=8, help="reports per trial")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--mem", default="1500M", help="memory of one post-processing array element")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "moetune-bench" / "login_node"
    work.mkdir(parents=True, exist_ok=True)
    if args.child:  # one mode in a fresh process: its ru_maxrss is that mode's alone
        report = synthetic_rank(work, args.kernels)
        print(json.dumps(tuner(args.child, work, report, args.ranks, args.trials, args.mem)))
        return
    if not shutil.which("sbatch"):
        raise SystemExit("no Slurm here: start it with scripts/slurm-up")
    t0 = time.perf_counter()
    report = synthetic_rank(work, args.kernels)
    build_s = time.perf_counter() - t0
    runs = {}
    for mode in ("login", "job"):  # side by side, one after the other, in one run
        p = subprocess.run([sys.executable, __file__, "--child", mode, "--kernels", str(args.kernels),
                            "--ranks", str(args.ranks), "--trials", str(args.trials), "--mem", args.mem],
                           capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(f"{mode}: {p.stderr[-1500:]}")
        runs[mode] = json.loads(p.stdout.strip().splitlines()[-1])
    same = runs["login"].pop("analyses") == runs["job"].pop("analyses")
    login, job = runs["login"], runs["job"]
    result = {"kernels_per_report": args.kernels, "reports_per_trial": args.ranks, "trials": args.trials,
              "report_mb": round(report.stat().st_size / 2**20, 1), "build_s": round(build_s, 1),
              "same_analysis": same, "login": login, "job": job,
              "nodes": subprocess.run(["sinfo", "-h", "-o", "%D %c %m"], capture_output=True,
                                      text=True).stdout.strip()}
    (REPO / "benchmarks" / "results").mkdir(exist_ok=True)
    (REPO / "benchmarks" / "results" / "login_node.json").write_text(json.dumps(result, indent=1) + "\n")
    walls = job["postprocess_job_wall_s"]
    section = (
        "## Login node: post-processing in the tuner or as Slurm jobs\n\n"
        f"`.venv/bin/python benchmarks/login_node.py --kernels {args.kernels} --ranks {args.ranks} "
        f"--trials {args.trials}`: a study of {args.trials} trials, each bringing "
        f"{args.ranks} reports of a synthetic {args.kernels:,}-kernel single-rank export "
        f"({result['report_mb']} MB each). Each mode is a fresh child process playing the tuner with the "
        "functions the trial's stages call: `login` runs analysis.analyze on the reports in that process "
        "(before item 4, or `cluster.postprocess.where: login`); `job` submits the post-processing job "
        "array after each trial's job (`--dependency=afterany`, one element per rank, "
        f"`--mem={args.mem}`) and only combines the per-rank summaries. The trial's own job is a "
        "`sleep 1` stand-in (the reports are already there; a .sqlite report skips `nsys export`). "
        "Both modes ran in the same run, one after the other, on this 2-core machine shared with other "
        "engineers, the Slurm nodes being this same machine (so the job mode moves the work off the "
        "tuner's process, not off the host here). Results: benchmarks/results/login_node.json.\n\n"
        "| tuner process | peak memory (ru_maxrss) | CPU time | its child processes' CPU (login: the trace reader's workers; job: sbatch/sacct/squeue) | wall |\n"
        "|---|---|---|---|---|\n"
        f"| post-processing in the tuner (`login`) | {login['peak_rss_mb']} MB | {login['cpu_s']} s | "
        f"{login['children_cpu_s']} s | {login['wall_s']} s |\n"
        f"| post-processing as Slurm jobs (`job`) | {job['peak_rss_mb']} MB | {job['cpu_s']} s | "
        f"{job['children_cpu_s']} s | {job['wall_s']} s |\n\n"
        f"Post-processing job wall time per trial ({args.ranks} array elements, first start to last "
        f"end, sacct): {', '.join(f'{w:.0f} s' for w in walls)}. The combined analyses of both modes "
        f"are {'identical' if same else 'DIFFERENT'}. Each rank's summary is {job['summary_mb']} MB "
        f"beside its {result['report_mb']} MB report. Of the job mode's peak, {job['rss_after_imports_mb']} MB "
        "is the interpreter with pandas and moetune imported; most of the rest is the cross-rank "
        "all-to-all split (moetune/analysis/skew.py) over every rank's all-to-all kernels, which this synthetic "
        "trace makes one kernel in eight (a real trace has far fewer).\n")
    doc = REPO / "docs" / "benchmarks.md"
    text = doc.read_text()
    marker = "## Login node: post-processing in the tuner or as Slurm jobs"
    if marker in text:
        head, _, rest = text.partition(marker)
        tail = rest[rest.find("\n## ") + 1:] if "\n## " in rest else ""
        text = head + section + ("\n" + tail if tail else "")
    else:
        head, sep, rest = text.partition("## Device tuning run")
        text = head + section + "\n" + sep + rest
    doc.write_text(text)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
