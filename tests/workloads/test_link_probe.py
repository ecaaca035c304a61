"""workloads/link_probe.py, run here as the job runs it (by its path, torch only, no moetune): the group
shapes it measures from where each rank sits, and its record from two gloo ranks on this machine.
(Through Slurm, with the login side storing and using it: tests/trial/test_calibrate.py.)"""
from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest

from moetune.workloads import link_probe as probe
from moetune.experiment.megatron_validate import venv_python


def test_group_shapes_follow_where_the_ranks_sit():
    """Ranks by node: a node's ranks, one rank of each node, and all of them where that is a third
    shape; a shape of one-rank groups, or one equal to another, is left out."""
    assert probe.shapes(["a", "a", "b", "b"]) == {"node": [[0, 1], [2, 3]], "across": [[0, 2], [1, 3]],
                                                  "world": [[0, 1, 2, 3]]}
    assert probe.shapes(["a", "b"]) == {"across": [[0, 1]]}
    assert probe.shapes(["a", "a"]) == {"node": [[0, 1]]}
    assert probe.shapes(["a"]) == {}
    assert probe.shapes(["a", "a", "b"]) == {"node": [[0, 1], [2]]}  # uneven nodes: no across shape


def test_two_gloo_ranks_on_one_node_write_one_record_of_rows(tmp_path):
    """Two processes of the probe, as a job's two ranks on one node: rank 0's record (file and the
    line after MARKER agree) has each collective at each size asked for over the node's two ranks,
    bus bandwidth as nccl-tests counts it, the CPU GEMMs (the square and the sweep, each rate its
    FLOPs over its time) and a launch row, and says it skipped the copies and DeepEP
    and HybridEP for want of a GPU."""
    py = venv_python()
    if not py.exists():
        pytest.skip(f"{py}: no Python with torch here (MEGATRON_VENV)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "calibration.json"
    procs = [subprocess.Popen([str(py), probe.__file__, "--out", str(out), "--sizes", "4096,65536", "--iters", "2"],
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "SLURMD_NODENAME": "n1"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/") for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-500:]
    (line,) = [x for x in outs[0][0].splitlines() if x.startswith(probe.MARKER)]
    rec = json.loads(line[len(probe.MARKER):])
    assert rec == json.loads(out.read_text()) and not any(x.startswith(probe.MARKER) for x in outs[1][0].splitlines())
    assert (rec["backend"], rec["world_size"], rec["nodes"], rec["sizes"]) == ("gloo", 2, ["n1", "n1"], [4096, 65536])
    coll = [r for r in rec["rows"] if r["kind"] == "collective"]
    assert {(r["op"], r["bytes"]) for r in coll} == {(op, b) for op in probe.OPS for b in (4096, 65536)}
    for r in coll:
        assert (r["group"], r["ranks"], r["nodes"]) == ("node", 2, 1) and r["us"] > 0
        factor = 1.0 if r["op"] == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n at n = 2
        assert r["busbw_gb_s"] == pytest.approx(r["algbw_gb_s"] * factor, abs=2e-4)
        assert r["algbw_gb_s"] == pytest.approx(r["bytes"] / r["us"] / 1e3, rel=0.01, abs=2e-4)
    gemms = [r for r in rec["rows"] if r["kind"] == "gemm"]
    assert [(r["op"], r["m"], r["k"], r["n"]) for r in gemms] == (
        [("matmul",) + (probe.GEMM_N["cpu"],) * 3] + [("mnk", *s) for s in probe.GEMM_SWEEP["cpu"]])
    for r in gemms:
        assert r["dtype"] == "float32" and r["gflop"] == pytest.approx(2 * r["m"] * r["k"] * r["n"] / 1e9, rel=1e-4)
        assert r["tflop_s"] == pytest.approx(r["gflop"] / r["us"] * 1e3, rel=0.01)
    (launch,) = [r for r in rec["rows"] if r["kind"] == "launch"]
    assert launch["n"] == probe.LAUNCHES and launch["us"] > 0
    assert {s["what"] for s in rec["skipped"]} == {"copy", "deep_ep", "hybrid_ep"}
    assert all("no GPU" in s["why"] for s in rec["skipped"])
