"""The preflight (trial/preflight.py, workloads/preflight_probe.py, experiment/preflight.py): a one-node job of
the trials' own template through the real Slurm of this machine reads back what a trial will meet
(CPUs, NUMA nodes, the nsys and whether it has `nsys recipe`, Megatron, the runs folder), and
what blocks trials stops the tuner before its first one with one line naming the fix."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moetune.analysis.nsys import has_recipes, version
from moetune.decide import rules as rules_mod
from moetune.job import scheduler as jobs
from moetune.paths import WORKLOADS
from moetune.experiment import preflight as spec
from moetune.experiment.config import TrainingConfig
from moetune.experiment.constraints import check
from moetune.experiment.schema import Cluster, load_experiment
from moetune.experiment.megatron_validate import available as megatron_available, venv_python
from moetune.store import Store
from moetune.trial import preflight
from moetune.tune import loop as tuner
from tests.conftest import REPO, stand_in_cluster, stand_in_experiment

ENTRY_HAS_CHECK = "--moetune-check" in (WORKLOADS / "train_moe.py").read_text()


def _checks(out) -> dict:
    return {p.check: p for p in out.problems}


@pytest.mark.slurm
@pytest.mark.nsys
def test_preflight_through_slurm_records_cpus_numa_nsys_and_the_runs_folder(slurm, nsys_bin, tmp_path):
    """The probe runs as a Slurm job on a node of this cluster and reports this machine's CPUs and
    NUMA nodes, the installed nsys (its version, and whether it has `nsys recipe`: where not, as
    Debian's 2022.4, a note, not a block) and the token
    the login side wrote, read back by the same path; the record is stored per cluster and image."""
    store = Store(str(tmp_path / "db.sqlite"))
    cluster = Cluster(**stand_in_cluster(nsys=nsys_bin, python=sys.executable))
    out = preflight.run(cluster, executor="slurm", runs_root=tmp_path / "runs", store=store, poll_s=1,
                        timeout_s=300)
    rec = out.record
    assert rec["job"]["state"] == "COMPLETED" and rec["host"] in slurm["nodes"]
    assert jobs.slurm_state(out.job_id).state == "COMPLETED"
    assert rec["cpus"]["node"] == os.cpu_count()
    assert 1 <= rec["cpus"]["task"] <= os.cpu_count()
    assert len(rec["cpus"]["numa_nodes"]) == len(glob.glob("/sys/devices/system/node/node[0-9]*"))
    assert rec["nsys"]["version"] in version(nsys_bin) and rec["nsys"]["recipe"] is has_recipes(nsys_bin)
    assert rec["runs_folder"]["seen"] == rec["runs_folder"]["expected"]
    ib = "/sys/class/infiniband"
    assert rec["infiniband"] == (sorted(os.listdir(ib)) if os.path.isdir(ib) else [])
    found = _checks(out)
    assert not out.blocking, [p.line for p in out.blocking]
    if not has_recipes(nsys_bin):
        assert found["nsys_recipe"].blocking is False and rec["nsys"]["version"] in found["nsys_recipe"].message
    assert out.capabilities["numa_nodes"] == len(rec["cpus"]["numa_nodes"])
    assert "has_transformer_engine" not in out.capabilities  # the stand-in's venv is no GPU image
    row = store.latest_preflight("test-1node", spec.image_key(cluster))
    assert row.job_id == out.job_id and row.blocking == 0 and row.record["cpus"] == rec["cpus"]
    # a later tuner takes the stored record while the cluster keys and runs folder are unchanged
    again = preflight.current(cluster, store, tmp_path / "runs")
    assert again is not None and again.job_id == out.job_id and again.stored_at
    assert preflight.current(cluster.model_copy(update={"nsys": "off"}), store, tmp_path / "runs") is None


@pytest.mark.slurm
def test_preflight_blocks_a_megatron_workload_where_the_image_has_no_megatron(slurm, tmp_path):
    """The login venv (no torch, no megatron) as a Megatron workload's interpreter: the entry's
    check cannot run, and no GPU is visible; both block, each line naming the fix."""
    cluster = Cluster(**stand_in_cluster(workload="megatron", gpus_per_node=0, python=sys.executable, nsys="off"))
    out = preflight.run(cluster, executor="slurm", runs_root=tmp_path / "runs", poll_s=1, timeout_s=300)
    found = _checks(out)
    assert {"megatron", "gpu"} <= {p.check for p in out.blocking}
    assert "no megatron-core" in found["megatron"].message and "megatron-core" in found["megatron"].fix
    assert "fix: " in found["megatron"].line and "\n" not in found["megatron"].line
    assert found["gpu"].line.startswith("no GPU visible to the job on n")
    assert out.capabilities["has_transformer_engine"] is False  # probed: a Megatron image without TE


@pytest.mark.slurm
@pytest.mark.megatron
@pytest.mark.skipif(not megatron_available(), reason="no .venv-megatron (scripts/megatron-venv)")
def test_preflight_with_the_megatron_venv_finds_megatron_core_0_19(slurm, tmp_path):
    """cluster.python pointed at the Megatron venv: the probe, run by that interpreter in the
    job, finds megatron-core 0.19.2 and torch; the training entry's own check says it can run."""
    cluster = Cluster(**stand_in_cluster(workload="megatron", gpus_per_node=0, python=str(venv_python()),
                                         nsys="off", time_limit="00:10:00"))
    out = preflight.run(cluster, executor="slurm", runs_root=tmp_path / "runs", poll_s=2, timeout_s=600)
    rec = out.record
    assert rec["packages"]["megatron-core"].startswith("0.19.2") and rec["torch"]["version"]
    assert rec["python"]["version"].startswith("3.12")
    if not ENTRY_HAS_CHECK:
        pytest.skip("train_moe.py has no --moetune-check in this tree: the entry's verdict is not checked")
    assert rec["megatron"]["megatron_core"].startswith("0.19.2"), rec["megatron"]
    assert rec["megatron"]["entry"] == "ok" and rec["megatron"]["training"] is True
    assert "megatron" not in {p.check for p in out.problems}
    assert "gpu" in {p.check for p in out.blocking}  # no GPU on this machine


@pytest.mark.slurm
def test_preflight_runs_folder_not_the_same_on_the_compute_node_blocks(slurm, tmp_path):
    """What the compute node reads at the token's path differs from what the login node wrote
    (here: the file is rewritten after the job is rendered, before it is submitted): blocking."""
    cluster = Cluster(**stand_in_cluster(python=sys.executable, nsys="off"))
    s, token = preflight.prepare(cluster, tmp_path / "runs", "srun")
    Path(s.folder, preflight.TOKEN).write_text("someone else's folder\n")
    out = preflight.finish(cluster, s, token, "slurm", poll_s=1, timeout_s=300)
    found = _checks(out)
    assert [p.check for p in out.blocking] == ["runs_folder"]
    line = found["runs_folder"].line
    assert line.startswith("the runs folder is not the same on n") and "someone else" in line
    assert "fix: give --runs a folder on a file system the compute nodes mount" in line


@pytest.mark.slurm
def test_moetune_preflight_cli_exit_codes_and_lines(slurm, tmp_path):
    """`moetune preflight`: exit 1 and the blocking line (nsys missing while profiling is on) with
    its fix; exit 0 and the table when nothing blocks; exit 2 for an unknown experiment."""
    env = {**os.environ, "MOETUNE_DB": str(tmp_path / "db.sqlite")}

    def moetune(*args):
        return subprocess.run([sys.executable, "-m", "moetune.cli.main", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=400)

    bad = stand_in_experiment(tmp_path, "pf_bad", {"python": sys.executable, "nsys": "/no/such/nsys"})
    r = moetune("preflight", bad, "--executor", "slurm", "--runs", str(tmp_path / "runs"))
    assert r.returncode == 1, r.stderr
    assert "- nsys '/no/such/nsys' not found in the job on n" in r.stdout
    assert "fix: install Nsight Systems in the image or set cluster.nsys" in r.stdout
    good = stand_in_experiment(tmp_path, "pf_good", {"python": sys.executable})
    r = moetune("preflight", good, "--executor", "slurm", "--runs", str(tmp_path / "runs"), "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["blocking"] == [] and data["record"]["runs_folder"]["seen"] == data["record"]["runs_folder"]["expected"]
    r = moetune("preflight", "no_such_model")
    assert r.returncode == 2 and r.stderr.startswith("moetune preflight: ") and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slurm
def test_tuner_stops_before_trial_1_when_the_preflight_blocks_and_resumes_once_it_passes(slurm, tmp_path):
    """A blocking preflight problem stops the study before any trial, with a stop decision whose
    reason is the problem's line and fix, and the reports are written; with the cause fixed, the
    same study resumes and runs its baseline."""
    from moetune.report import study as report
    store = Store(str(tmp_path / "db.sqlite"))
    path = stand_in_experiment(tmp_path, "pf_tune", {"python": sys.executable, "nsys": "/no/such/nsys"},
                               {"budget_trials": 1})
    s = tuner.tune(path, store, executor="slurm", runs_root=tmp_path / "runs", progress=False)
    study = store.study(s["study"])
    assert store.trials(study.id) == [] and study.state == "done"
    stop = [d for d in store.decisions(study.id) if d.kind == "stop"]
    assert len(stop) == 1 and s["stop_reason"] == stop[0].reason
    assert "nsys '/no/such/nsys' not found" in stop[0].reason and "fix: install Nsight Systems" in stop[0].reason
    assert "\n" not in stop[0].reason and stop[0].evidence["blocking"][0]["check"] == "nsys"
    md, html = report.write_reports(store, study.name, tmp_path / "reports")
    assert "/no/such/nsys" in md.read_text() and html.exists()
    # fixed: profiling off; the preflight passes, the study resumes and runs its baseline
    Path(path).write_text(Path(path).read_text().replace("/no/such/nsys", "'off'"))
    s = tuner.tune(path, store, executor="slurm", runs_root=tmp_path / "runs", progress=False)
    kinds = [d.kind for d in store.decisions(study.id)]
    assert kinds[:4] == ["stop", "preflight", "resume", "keep"], kinds
    assert store.trials(study.id)[0].state == "completed"


@pytest.mark.e2e
def test_tuner_with_the_local_executor_records_the_preflight_and_the_replay_skips_it(tmp_path):
    """submitit's local executor runs the same probe on this machine before the baseline (a
    `preflight` decision with what it found); the replay, which submits no job, records that it
    did not run one."""
    store = Store(str(tmp_path / "db.sqlite"))
    path = stand_in_experiment(tmp_path, "pf_local", {"python": sys.executable}, {"budget_trials": 1})
    s = tuner.tune(path, store, executor="local", runs_root=tmp_path / "runs", progress=False)
    first = store.decisions(store.study(s["study"]).id)[0]
    assert first.kind == "preflight" and "nothing blocks" in first.reason
    assert first.evidence["capabilities"]["node_cpus"] == os.cpu_count()
    assert Path(first.evidence["preflight"], "preflight.json").exists()
    s = tuner.tune("moe_proxy", store, executor="replay", runs_root=tmp_path / "runs", progress=False,
                   max_trials=1)
    first = store.decisions(store.study(s["study"]).id)[0]
    assert first.kind == "preflight" and first.reason.startswith("not run: the replay")


# -- capabilities under the YAML's explicit values (pure) ---------------------------------------
def _record(**sections) -> dict:
    """A record as workloads/preflight_probe.py writes it, with the sections a test sets."""
    rec = {"probe": 1, "host": "gpu1", "runs_folder": {"expected": "t", "seen": "t"},
           "megatron": {"megatron_core": "0.19.2", "entry": "ok", "training": True, "api": "0.19"},
           "gpus": {"source": "nvidia-smi", "devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.65}] * 8},
           "torch": {"version": "2.11.0", "cuda": "13.0", "cuda_available": True},
           "transformer_engine": {"importable": True, "version": "2.20.2"},
           "apex": {"importable": False, "error": "ModuleNotFoundError: No module named 'apex'"},
           "deep_ep": {"importable": True, "hybrid_ep": True, "nvshmem_built": True},
           "driver_params": {"source": "/proc/driver/nvidia/params", "stream_mem_ops": False,
                             "peer_mapping_override": False, "gdrdrv": False},
           "nsys": {"binary": "nsys", "path": "/usr/bin/nsys", "version": "2025.3.1", "recipe": True},
           "cpus": {"node": 112, "task": 14, "numa_nodes": {"0": "0-55", "1": "56-111"}},
           "infiniband": ["mlx5_0"]}
    rec.update(sections)
    return rec


def test_preflight_capabilities_resolve_under_the_yamls_explicit_values():
    """Each probed capability fills a cluster key the YAML leaves unset; an explicit YAML value
    wins; the rule table's context and the constraint checker see the resolved values."""
    exp = load_experiment("moe_proxy")
    cluster = exp.cluster.model_copy(update={"has_transformer_engine": False, "has_deep_ep": None,
                                             "has_hybrid_ep": None, "has_apex": None, "gpu_memory_gb": None})
    caps = spec.capabilities(_record(), cluster)
    assert caps == {"has_transformer_engine": True, "has_deep_ep": True, "has_hybrid_ep": True, "has_apex": False,
                    "gpus_per_node": 8, "gpu_memory_gb": 79.65, "node_cpus": 112, "task_cpus": 14,
                    "numa_nodes": 2, "megatron_core": "0.19.2"}
    resolved = spec.resolve(cluster, caps)
    assert isinstance(resolved, Cluster)
    assert resolved.has_transformer_engine is False  # the YAML said so
    assert (resolved.has_deep_ep, resolved.has_hybrid_ep, resolved.has_apex) == (True, True, False)
    assert resolved.gpu_memory_gb == 79.65 and resolved.gpus_per_node == cluster.gpus_per_node
    flex = TrainingConfig().replace(dispatcher="flex", ep=2)
    before = {v.code for v in check(flex, exp.model, cluster)}
    after = {v.code for v in check(flex, exp.model, resolved)}
    assert "flex_needs_deep_ep" in before and "flex_needs_deep_ep" not in after
    ctx = rules_mod.context({"metrics": {"combined": {}}}, flex, exp.model, resolved)
    assert ctx["cluster"]["has_deep_ep"] is True and ctx["cluster"]["has_transformer_engine"] is False
    # an explicit value of another cluster wins too; nothing probed leaves it as it was
    assert spec.resolve(Cluster(has_deep_ep=False), caps).has_deep_ep is False
    assert spec.resolve(cluster, {}) is cluster


def test_preflight_across_nodes_deep_ep_needs_ibgda_and_the_problems_table():
    """Two nodes: a DeepEP without IBGDA (driver settings absent, no GDRCopy) is not a capability,
    and says why in a note; a Megatron the entry cannot run on blocks with the entry's own fix."""
    two = Cluster(name="c", workload="megatron", nodes=2, gpus_per_node=8, nsys="nsys")
    caps = spec.capabilities(_record(), two)
    assert caps["has_deep_ep"] is False and caps["has_hybrid_ep"] is False
    notes = {p.check: p for p in spec.problems(_record(), two)}
    assert not notes["ibgda"].blocking and "NVreg_EnableStreamMemOPs=1" in notes["ibgda"].message
    ok = _record(driver_params={"source": "/proc/driver/nvidia/params", "stream_mem_ops": True,
                                "peer_mapping_override": True, "gdrdrv": False})
    assert spec.capabilities(ok, two)["has_deep_ep"] is True
    old = _record(megatron={"megatron_core": "0.15.0", "megatron_from": "/opt/megatron-lm", "training": True,
                            "api": "legacy", "entry": "pretrain() takes the pre-0.19 arguments",
                            "fix": "use megatron-core 0.19 or later (pip install megatron-core==0.19.2)"})
    (p,) = [p for p in spec.problems(old, two) if p.blocking]
    assert p.check == "megatron" and "megatron-core 0.15.0 from /opt/megatron-lm" in p.message
    assert p.line.endswith("fix: use megatron-core 0.19 or later (pip install megatron-core==0.19.2)")
    assert not [p for p in spec.problems(_record(), two.model_copy(update={"nodes": 1})) if p.blocking]
