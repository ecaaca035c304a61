"""`moetune calibrate` (trial/calibrate.py, cli/calibrate.py): the probe runs as a job of the trials'
own template through the real Slurm of this machine with the CPU stand-in (gloo over loopback: 2
nodes x 2 ranks, so groups of 2 ranks on one node and of 2 ranks over 2 nodes), its rows are stored
per cluster, and a later `moetune predict` uses them over the published rates, naming them
"measured", its all-to-all term the measured bandwidth's; bad input and a failed job give one line,
exit 2."""
from __future__ import annotations

import json
import math
import sys

import pytest

from moetune.cli.main import main
from moetune.estimate.measured import LINK_TABLE_ROWS
from moetune.experiment.megatron_validate import venv_python
from moetune.store import Store
from tests.conftest import stand_in_experiment

# the rates the stand-in's collectives measure; what is measured on a GPU stays published on CPU
LINK_RATES = {"nic_gb_s", "alltoall_nvlink", "alltoall_rdma", "collective_nvlink", "collective_rdma"}
CLUSTER = {"name": "cpu-2node", "nodes": 2, "ntasks_per_node": 2, "nvlink_domain": 2, "mem": "1G"}


def _torch_python() -> str:
    """The megatron venv's Python: the stand-in image for the probe, which needs torch."""
    py = venv_python()
    if not py.exists():
        pytest.skip(f"{py}: no Python with torch here (MEGATRON_VENV)")
    return str(py)


def _predict(capsys, db, exp) -> dict:
    capsys.readouterr()
    assert main(["--db", db, "predict", exp, "--ep", "4", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _err_lines(capsys) -> list[str]:
    return [l for l in capsys.readouterr().err.strip().splitlines() if l.startswith("moetune calibrate:")]


@pytest.mark.slurm
def test_calibration_through_slurm_is_stored_and_replaces_the_published_link_rates(slurm, tmp_path, capsys):
    """Two nodes of two ranks each: the record holds all four collectives over a node's ranks and
    over one rank of each node, from both nodes, and names what it skipped on CPU (copies, DeepEP, HybridEP);
    it is stored under the cluster's name; predict then names each link rate it replaced
    "measured" (GEMM efficiency stays published) and its all-to-all per layer is the bytes over the
    measured all-to-all bus bandwidth of the size nearest the layout's message."""
    db = str(tmp_path / "db.sqlite")
    exp = stand_in_experiment(tmp_path, "calib", cluster={**CLUSTER, "python": _torch_python()})
    before = _predict(capsys, db, exp)
    # before: only the NVLink rows of the link table shipped for the GPU type (estimate/link_tables)
    shipped = {n for n, r in before["rates"].items() if r["source"].startswith("measured:")}
    assert shipped == set(LINK_TABLE_ROWS)
    assert all(before["rates"][n]["source"].startswith("measured: link table") for n in shipped)
    code = main(["--db", db, "calibrate", exp, "--executor", "slurm", "--runs", str(tmp_path / "runs"),
                 "--nodes", "2", "--gpus", "4", "--timeout", "300"])
    out = capsys.readouterr().out
    assert code == 0, out
    row = Store(db, read_only=True).latest_calibration("cpu-2node")
    rec = row.record
    assert rec["backend"] == "gloo" and rec["world_size"] == 4 and row.gpu_type == "H100"
    assert len(set(rec["nodes"])) == 2 and set(rec["nodes"]) <= set(slurm["nodes"])
    assert rec["job"]["state"] == "COMPLETED" and rec["job"]["job_id"] == row.job_id
    rows = rec["rows"]
    for group, nodes in (("node", 1), ("across", 2)):
        got = {r["op"] for r in rows if r.get("group") == group and r["ranks"] == 2 and r["nodes"] == nodes}
        assert got == {"all_to_all", "all_gather", "reduce_scatter", "all_reduce"}, group
    assert {s["what"] for s in rec["skipped"]} == {"copy", "deep_ep", "hybrid_ep"}
    assert f"calibration {row.id} of cluster cpu-2node" in out

    after = _predict(capsys, db, exp)
    measured = {n for n, r in after["rates"].items() if r["source"].startswith("measured:")}
    assert measured == LINK_RATES
    assert after["inputs"]["rates_measured"] == sorted(LINK_RATES)
    a2a = after["inputs"]["ep_a2a_per_layer"]
    sent = a2a["bytes_sent"]
    near = min({r["bytes"] for r in rows if "bytes" in r}, key=lambda b: abs(math.log(b / sent)))  # the size read
    node_bw, across_bw = ([r["busbw_gb_s"] for r in rows if r["op"] == "all_to_all" and r["group"] == g
                           and r["bytes"] == near][0] for g in ("node", "across"))
    want = 1e3 * max(sent * a2a["share_in_nvlink"] / (node_bw * 1e9), sent * a2a["share_across"] / (across_bw * 1e9))
    assert a2a["dispatch_ms"] == pytest.approx(want, rel=1e-3)
    assert after["terms"]["ep_a2a"] > before["terms"]["ep_a2a"]  # gloo over loopback is no NVLink
    # a cluster under another name has no calibration: the published rates
    other = stand_in_experiment(tmp_path, "other", cluster={**CLUSTER, "name": "elsewhere"})
    assert "calibration" not in _predict(capsys, db, other)["inputs"]


@pytest.mark.slurm
def test_a_failed_calibration_job_is_one_line_exit_2_and_stores_nothing(slurm, tmp_path, capsys):
    """The login venv (no torch) as the image's Python: the probe cannot start, the job fails, and
    calibrate says so in one line naming the job and its log, with nothing stored."""
    db = str(tmp_path / "db.sqlite")
    exp = stand_in_experiment(tmp_path, "calib", cluster={**CLUSTER, "python": sys.executable})
    code = main(["--db", db, "calibrate", exp, "--executor", "slurm", "--runs", str(tmp_path / "runs"),
                 "--timeout", "300"])
    (line,) = _err_lines(capsys)
    assert code == 2 and "calibration job" in line and "torch" in line
    assert Store(db, read_only=True).latest_calibration("cpu-2node") is None


def test_bad_input_is_one_line_exit_2_before_any_job(tmp_path, capsys):
    """An unknown model, and a rank count the nodes do not divide: one line each, exit 2, no job
    folder made."""
    exp = stand_in_experiment(tmp_path, "calib", cluster=CLUSTER)
    runs = tmp_path / "runs"
    for argv, says in ((["no_such_model"], "no_such_model"), ([exp, "--gpus", "3", "--nodes", "2"], "--gpus 3"),
                       ([exp, "--nodes", "5"], "--nodes 5")):
        code = main(["--db", str(tmp_path / "db.sqlite"), "calibrate", *argv, "--runs", str(runs)])
        (line,) = _err_lines(capsys)
        assert code == 2 and says in line, argv
    assert not (runs / "_calibrate").exists()
