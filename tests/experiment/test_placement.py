"""A study's placement (experiment/placement.py): decided once when the tuner starts the study,
stored in its record, read back as the same Placement; a record stored before placements were
kept reads back what its tuning.one_gpu implied."""
from __future__ import annotations

import pytest

from moetune.experiment.placement import Placement
from moetune.experiment.schema import ConfigError, Tuning, load_experiment
from moetune.store import Store
from moetune.tune import loop as tuner


def test_decide_one_gpu_or_the_whole_cluster():
    one = Placement.decide(Tuning(one_gpu=True), 16, 4)
    assert (one.kind, one.one_gpu, one.gpus, one.world, one.samples, one.rank) == ("one_gpu", True, 1, 16, 4, None)
    assert one.at_rank(12).rank == 12 and one.rank is None  # frozen: a trial's copy, the study's unchanged
    whole = Placement.decide(Tuning(), 16, 4)
    assert (whole.kind, whole.one_gpu, whole.gpus, whole.samples) == ("cluster", False, 16, None)
    assert whole.at_rank(3) == whole  # a cluster trial runs every rank
    with pytest.raises(AttributeError):
        one.kind = "cluster"


def test_stored_and_read_back():
    one = Placement.decide(Tuning(one_gpu=True), 8, 32)
    record = {"tuning": {"one_gpu": False}, "placement": one.to_dict()}
    assert record["placement"] == {"kind": "one_gpu", "world": 8, "samples": 32, "gpus": 1}
    assert Placement.of_study(record) == one  # the stored placement, not what tuning says now


def test_a_record_stored_before_placements_reads_back_what_its_tuning_implied():
    old = {"tuning": {"one_gpu": True, "one_gpu_samples": 4}, "cluster": {"nodes": 2, "gpus_per_node": 8}}
    assert Placement.of_study(old) == Placement("one_gpu", 16, 4)
    assert Placement.of_study({"cluster": {"nodes": 2, "gpus_per_node": 8}}) == Placement("cluster", 16)
    assert Placement.of_study({"tuning": {"one_gpu": False}}, world=4).gpus == 4


def test_a_stored_placement_of_an_unknown_kind_is_one_line():
    with pytest.raises(ConfigError, match=r"^placement kind 'two_gpu': use one of cluster, one_gpu$"):
        Placement.of_study({"placement": {"kind": "two_gpu", "world": 8}})
    with pytest.raises(ConfigError, match=r"^stored placement .*; it needs kind and world$"):
        Placement.of_study({"placement": {"kind": "one_gpu"}})


def _tuner(exp, store, tmp_path, name):
    return tuner.Tuner(exp, store, executor="local", runs_root=tmp_path / "runs", study_name=name,
                       progress=False)


def test_the_tuner_decides_it_once_and_stores_it_with_the_study(tmp_path):
    exp = load_experiment("deepseek_v3")
    exp.tuning = exp.tuning.model_copy(update={"one_gpu": True})
    store = Store(str(tmp_path / "db.sqlite"))
    t = _tuner(exp, store, tmp_path, "ds-1gpu")
    assert t.placement == Placement("one_gpu", exp.cluster.world, 32) and t.gpus == 1
    stored = store.study("ds-1gpu").experiment
    assert stored["placement"] == t.placement.to_dict() and Placement.of_study(stored) == t.placement
    assert stored["tuning"]["one_gpu_samples"] == 32  # still there for the readers of the tuning
    # resumed: the study and its placement as stored
    again = _tuner(exp, store, tmp_path, "ds-1gpu")
    assert again.study.id == t.study.id and again.placement == t.placement
    whole = _tuner(load_experiment("deepseek_v3"), store, tmp_path, "ds")
    assert whole.placement == Placement("cluster", exp.cluster.world) and whole.gpus == exp.cluster.world
    assert whole.model is not None and t.model is None  # the step model prices whole-cluster steps only


def test_a_study_stored_before_placements_resumes_with_the_one_its_tuning_implied(tmp_path):
    exp = load_experiment("deepseek_v3")
    exp.tuning = exp.tuning.model_copy(update={"one_gpu": True})
    store = Store(str(tmp_path / "db.sqlite"))
    t = _tuner(exp, store, tmp_path, "old-1gpu")
    record = {k: v for k, v in store.study("old-1gpu").experiment.items() if k != "placement"}
    store.set_study_experiment(t.study.id, record)
    resumed = _tuner(exp, store, tmp_path, "old-1gpu")
    assert resumed.study.id == t.study.id and "placement" not in resumed.study.experiment
    assert resumed.placement == Placement("one_gpu", exp.cluster.world, 32)
