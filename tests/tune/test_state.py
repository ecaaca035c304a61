"""tune/state.py: a study's state read from the store alone. The recorded device study's store gives
back its crashed rule, its incumbent and its budget; a crash is told from a layout Megatron refused;
a memory fix is the next parent only where its fit measured a lower peak."""
import shutil
from pathlib import Path

from moetune.store import Store
from moetune.experiment.schema import Cluster
from moetune.tune.state import (JUDGED, StudyState, crashed, image_of, lowered, measured_fit,
                                         study_state)

# the device run judged by 2 standard errors (its store and analyses)
PREV = Path(__file__).resolve().parents[1] / "data" / "gpu" / "tuning_2se"


def recorded_store(tmp_path) -> Store:
    db = tmp_path / "moetune.db"
    shutil.copyfile(PREV / "moetune.db", db)
    return Store(str(db))


def test_a_rule_whose_trial_crashed_is_not_tried_again_in_the_study(tmp_path):
    """The recorded device study: local CUDA graphs crashed trial 6 (stream capture invalidated);
    the study state remembers it, so no later parent spends a trial on it again."""
    store = recorded_store(tmp_path)
    study = store.study("moe_proxy")
    st = study_state(store, study, Cluster(name="device-h200x2"))
    assert st.crashed == {"cuda_graphs_local": 6}
    assert "manual_gc" not in st.crashed  # reverted within noise: not a crash


def test_a_layout_megatron_refuses_is_not_a_crash():
    """A failed job whose last lines are Megatron's own assertion is not a crash; one whose last
    lines show a CUDA error during capture is; an out-of-memory end is not, whatever it printed."""
    refused = ["[rank0]: AssertionError: eval_global_batch_size (16) must be divisible by "
               "eval_micro_batch_size (16) * data_parallel_size (2)"]
    assert not crashed({"state": "failed", "last_lines": refused})
    capture = ["[rank0]: torch.AcceleratorError: CUDA error: operation failed due to a previous "
               "error during capture"]
    assert crashed({"state": "failed", "last_lines": capture})
    assert not crashed({"state": "oom", "last_lines": capture})


def test_the_recorded_study_reads_back_its_incumbent_parents_and_budget(tmp_path):
    """From the store alone: trial 3 (micro batch 4) is the incumbent, kept three trials ago; each
    parent's tried rules are what the decisions say; all six trials ran and their GPU hours add
    up; nothing is pending and the study's stop decision is the one it stopped on."""
    store = recorded_store(tmp_path)
    study = store.study("moe_proxy")
    st = study_state(store, study, Cluster(name="device-h200x2"))
    assert st.incumbent.number == 3 and st.since_keep == 3
    assert st.tried == {"cf9ac0795bcf8949": {"ep_a2a_overlap", "larger_micro_batch"},
                        "74accb21b07dcafb": {"cuda_graphs_local", "larger_micro_batch", "manual_gc"}}
    assert st.runs == 6 and st.pending is None and st.blocked == set()
    hours = sum(store.metrics(t.id).get("gpu_hours", 0.0) for t in store.trials(study.id))
    assert st.gpu_hours == hours > 0
    assert st.stopped.kind == "stop" and "patience 3" in st.stopped.reason


def test_a_trial_not_yet_judged_is_pending_and_a_not_applied_rule_is_blocked_on_its_image(tmp_path):
    """A trial with no judging decision is the pending one; a not_applied decision bars its rule on
    the same cluster and image only (another image retries it); a no_fit trial is not a run."""
    store = Store(str(tmp_path / "db.sqlite"))
    study = store.create_study("s", model="m")
    base = store.add_trial(study.id, {"tp": 1}, "h0", fix=None)
    store.update_trial(base.id, state="completed", step_time_ms=100.0)
    store.add_decision(study.id, "keep", "baseline", trial_id=base.id)
    fix = store.add_trial(study.id, {"tp": 2}, "h1", fix="flex_dispatch")
    store.update_trial(fix.id, state="completed", step_time_ms=99.0)
    store.add_decision(study.id, "not_applied", "no DeepEP kernels", trial_id=fix.id, rule="flex_dispatch",
                       evidence={"parent": "h0", "cluster": "c", "image": "img:1"})
    unfit = store.add_trial(study.id, {"tp": 4}, "h2", fix="recompute")
    store.update_trial(unfit.id, state="no_fit")
    st = study_state(store, study, Cluster(name="c", container_image="img:1"))
    assert st.pending.id == unfit.id and st.incumbent.id == base.id
    assert st.blocked == {"flex_dispatch"} and st.tried == {"h0": {"flex_dispatch"}}
    assert st.runs == 2 and st.since_keep == 1
    assert study_state(store, study, Cluster(name="c", container_image="img:2")).blocked == set()


def test_image_of_names_the_software_a_cluster_runs():
    """The container image, else the template (the schema's, "container", where none is set)."""
    assert image_of(Cluster(container_image="nvcr.io/x:1", template="container")) == "nvcr.io/x:1"
    assert image_of(Cluster(template="venv")) == "venv"
    assert image_of(Cluster()) == "container"


def test_a_memory_fix_is_the_next_parent_only_where_it_lowered_the_peak():
    """Any peak beats a parent that ran out of memory; a peak within 0.2 % of the parent's is the
    same memory measured again; none (out of memory) never beats a measured parent."""
    assert lowered(70.0, None) and lowered(None, None)
    assert lowered(79.0, 80.0)
    assert not lowered(80.0 * (1 - 0.001), 80.0) and not lowered(81.0, 80.0)
    assert not lowered(None, 80.0)


def test_a_fit_that_measured_nothing_is_not_a_parent():
    """A fit that measured a peak or ran out of GPU memory is a parent; one Megatron refused at
    start-up, or one killed for the node's memory, is not."""
    assert measured_fit({"fit": {"failure": None, "peak_gb": 70.0}})
    assert measured_fit({"fit": {"failure": "oom"}})
    assert not measured_fit({"fit": {"failure": "megatron_refused"}})
    assert not measured_fit({"fit": {"failure": "host_oom"}})


def test_the_kinds_that_judge_a_trial_are_the_loops_terminal_ones():
    """A study state built with no store decisions is empty; JUDGED holds every decision kind that
    ends a trial and not the ones that only begin or stop something."""
    assert StudyState().incumbent is None and StudyState().runs == 0
    assert {"keep", "revert", "not_applied", "unfit", "stage_error"} <= set(JUDGED)
    assert not {"apply", "stop", "resume"} & set(JUDGED)
