"""report/overview.py: the study report's headline where no trial ran names why the study stopped."""
from __future__ import annotations

from moetune.report import study as report
from moetune.report.overview import headline, prediction_sentence
from moetune.store import Store

PREFLIGHT_STOP = ("preflight of cluster c (job 7): the training entry cannot run on this image's Megatron "
                  "(no megatron-core): ModuleNotFoundError: No module named 'megatron'")


def test_a_study_stopped_before_its_first_trial_says_why_in_its_headline(tmp_path):
    """A study its preflight stopped: the headline says no trial ran and the stop's reason, with no
    `best ? ms` anywhere."""
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    study = store.create_study("s", "moe_proxy", {})
    store.add_decision(study.id, "stop", PREFLIGHT_STOP, rule="preflight", evidence={"blocking": True})
    md = report.study_markdown(store, "s")
    head = md.split("## Headline", 1)[1].split("##", 1)[0]
    assert f"No trial ran: the study stopped before its first: {PREFLIGHT_STOP}." in head
    assert "?" not in head


def test_no_trial_and_no_stop_reason_reads_as_before():
    assert headline([]) == (["No trials ran."], [], None)


def test_prediction_sentence_says_no_trial_rather_than_a_scale_of_none():
    """With no completed trial the model's scale is its default, not a measurement: the sentence
    says there is none instead of 'measured / model 1.00 (median of 0 completed trials)'."""
    s = {"prediction_scale": 1.0, "prediction_scale_from_trials": 0}
    assert prediction_sentence(s) == "Step-time model: no completed trial to set it against."
    s.update(prediction_scale=1.31, prediction_scale_from_trials=3)
    assert prediction_sentence(s).startswith("Step-time model: measured / model 1.31 (median of 3 completed trials)")
