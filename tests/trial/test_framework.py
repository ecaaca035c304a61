"""moetune/trial/framework.py runs any `Stage` it is given, knowing none by name: a stage made
here (not one of moetune's) is recorded in a real store with its inputs' hash, skipped while its
inputs and outputs are unchanged, run again when an input file changes, a missing output is
re-made, and force, its options and its input options reach it as the `Stage` declares; a failure
is recorded and raised as one line. The framework's source names no stage of trial/stages.py."""
from __future__ import annotations

import ast

import pytest

from moetune.errors import MoetuneError
from moetune.trial import framework, stages
from tests.conftest import REPO


def copy_stage(calls: list, **declared) -> framework.Stage:
    """A stage that copies in.txt to out.txt, noting each run's keyword arguments."""
    def inputs(t, **input_options):
        calls.append(("inputs", input_options))
        return [t.need(t.folder / "in.txt", "write-in")], {"upper": input_options.get("upper", False)}

    def do(t, **kwargs):
        calls.append(("do", kwargs))
        if (t.folder / "in.txt").read_text() == "fail":
            raise MoetuneError("in.txt says fail")
        out = t.folder / "out.txt"
        out.write_text((t.folder / "in.txt").read_text())
        return [out]

    return framework.Stage("copy", inputs, do, **declared)


def test_a_stage_of_its_own_is_recorded_skipped_rerun_and_forced(make_trial):
    store, tid = make_trial(executor="local")
    folder = framework.TrialContext(store, tid).folder
    folder.mkdir(parents=True)
    calls: list = []
    stage = copy_stage(calls, options=("upper",), input_options=("upper",), takes_force=True)
    (folder / "in.txt").write_text("a")
    assert framework.run(store, tid, stage) == [str(folder / "out.txt")]
    assert calls == [("inputs", {}), ("do", {"force": False})]
    framework.run(store, tid, stage, ignored=1)  # current: skipped, and an undeclared option dropped
    assert len(store.stage_runs(tid, "copy")) == 1 and calls[-1] == ("inputs", {})
    (folder / "in.txt").write_text("b")  # changed input: runs again
    framework.run(store, tid, stage)
    (folder / "out.txt").unlink()  # a missing output: runs again
    framework.run(store, tid, stage)
    framework.run(store, tid, stage, force=True, upper=True)
    assert calls[-2:] == [("inputs", {"upper": True}), ("do", {"force": True, "upper": True})]
    runs = store.stage_runs(tid, "copy")
    assert len(runs) == 4 and len({r.inputs_hash for r in runs}) == 3  # a, b, b upper


def test_undeclared_force_is_not_passed_and_a_failure_is_one_recorded_line(make_trial):
    store, tid = make_trial(executor="local")
    folder = framework.TrialContext(store, tid).folder
    folder.mkdir(parents=True)
    calls: list = []
    with pytest.raises(framework.StageError, match=r"in\.txt is missing; run `moetune stage write-in"):
        framework.run(store, tid, copy_stage(calls))
    (folder / "in.txt").write_text("fail")
    with pytest.raises(framework.StageError, match="^in.txt says fail$"):
        framework.run(store, tid, copy_stage(calls), force=True)
    assert calls[-1] == ("do", {})
    assert [(r.status, r.error) for r in store.stage_runs(tid, "copy")] == [("failed", "in.txt says fail")]


def test_the_framework_names_no_stage():
    tree = ast.parse((REPO / "moetune" / "trial" / "framework.py").read_text())
    said = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert said & set(stages.STAGES) == set()
    assert all(isinstance(s, framework.Stage) and s.name == name for name, s in stages.STAGES.items())
