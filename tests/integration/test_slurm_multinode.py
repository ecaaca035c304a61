"""Multi-node trials on the real multi-node Slurm of scripts/slurm-up: the CPU stand-in
for training at 2 nodes x 2 tasks through submitit, nsys 2022.4 profiling one rank on each node.
What each rank saw (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, its node) comes from the
stand-in's rank_<RANK>.json, written after the ranks met at the rendezvous address."""
from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from moetune.job import scheduler as jobs
from moetune.trial import stages
from tests.conftest import stand_in_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.nsys]


def hostnames(nodelist: str) -> list[str]:
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                          text=True, check=True).stdout.split()


def step_nodes(job_id: str, step: str = "0") -> list[str]:
    out = subprocess.run(["sacct", "-n", "-P", "-j", f"{job_id}.{step}", "-o", "NodeList"],
                         capture_output=True, text=True, check=True).stdout.split()
    return hostnames(out[0]) if out else []


def why_failed(folder: Path) -> list[str]:
    """The job log's lines that say why a step failed (the log alone, not its progress bars)."""
    log = folder / "log.txt"
    if not log.exists():
        return ["no log.txt"]
    keep = ("moetune:", "[Rank", "srun:", "error", "Error", "nsys", "slurmstepd")
    lines = [ln[:300] for ln in log.read_text(errors="replace").splitlines() if ln.startswith(keep) or "rror" in ln]
    return lines[-30:]


def test_two_node_study_through_slurm_under_nsys_on_each_node(slurm, nsys_bin, make_trial):
    """Two trials of two whole nodes each run through Slurm under nsys, with a profiled rank on each
    node, through the decide stage."""
    cluster = stand_in_cluster(name="test-2node", nodes=2, ntasks_per_node=2, profile_ranks=[0, 2])
    ids = []
    for mb in (1, 2):  # two trials, submitted together: each takes two whole nodes of three
        store, tid = make_trial(cluster=cluster, study="multinode", micro_batch=mb)
        stages.run_stage(store, tid, "render")
        stages.run_stage(store, tid, "submit")
        ids.append(tid)
    for tid in ids:
        stages.run_stages(store, tid, through="decide", poll_s=1, timeout_s=300)
        check_two_node_trial(slurm, store, tid)


def check_two_node_trial(slurm, store, tid):
    tr = store.trial(tid)
    folder = Path(tr.folder)
    st = jobs.slurm_state(tr.job_id)
    assert st.state == "COMPLETED" and tr.state == "completed", (st, tr.state, why_failed(folder))
    nodes = hostnames(st.node)
    assert len(nodes) == 2 and set(nodes) <= set(slurm["nodes"])
    assert step_nodes(tr.job_id) == nodes  # the training step ran on both nodes

    seen = {r: json.loads((folder / f"rank_{r}.json").read_text()) for r in range(4)}
    port = str(20000 + int(tr.job_id) % 20000)
    for r, s in seen.items():
        node = nodes[r // 2]  # block distribution: ranks 0, 1 on the first node, 2, 3 on the second
        assert (s["rank"], s["local_rank"], s["world_size"]) == (r, r % 2, 4)
        assert s["slurm_node"] == node and s["hostname"] == node
        assert (s["master_addr"], s["master_port"]) == (nodes[0], port)  # the first node's name
        assert s["slurm_job_id"] == tr.job_id
        assert s["profiled"] == (r in (0, 2))  # under nsys: one rank on each node
        # every rank met the other three at that address
        assert [(m["rank"], m["slurm_node"]) for m in s["met"]] == [(q, nodes[q // 2]) for q in range(4)]

    # one report per profiled rank, from both nodes, in the trial folder; exported and analysed
    assert sorted(p.name for p in folder.glob("trace_*.nsys-rep")) == ["trace_0.nsys-rep", "trace_2.nsys-rep"]
    for r in (0, 2):
        with sqlite3.connect(folder / f"trace_{r}.sqlite") as db:
            texts = [x[0] for x in db.execute("SELECT text FROM NVTX_EVENTS WHERE text LIKE 'iteration %'")]
        assert len(texts) == 8, f"rank {r}"
    analysis = json.loads((folder / "analysis.json").read_text())
    # both profiled ranks are analysed, one from each node's report, under their job ranks
    assert sorted(Path(p).name for p in analysis["sources"] if p.endswith(".sqlite")) == \
        ["trace_0.sqlite", "trace_2.sqlite"]
    per_rank = analysis["metrics"]["per_rank"]
    assert sorted(per_rank, key=int) == ["0", "2"] and all(m["steps"] == 8 for m in per_rank.values())
    assert analysis["metrics"]["combined"]["ranks"] == 2
    assert json.loads((folder / "decision.json").read_text())["trial"] == tr.number
