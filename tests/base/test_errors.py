"""One error base for the whole project: moetune/analysis/errors.py defines MoetuneError (the analysis imports
nothing of the pipeline) and moetune/errors.py names the same class; every exception class defined
in any module of moetune and moetune.analysis, found by importing each, derives from it, so
the CLI has one rule for "an engineer can fix this". A trace the real `moetune` command cannot read
is one line on stderr and exit code 2."""
from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys

import moetune.analysis
import moetune
from moetune.analysis import errors as analysis_errors
from moetune import errors as pipeline_errors


def error_classes() -> dict[str, type]:
    """Every exception class defined in a module of the two packages, by its qualified name."""
    found = {}
    for package in (moetune, moetune.analysis):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == info.name and issubclass(cls, BaseException):
                    found[f"{info.name}.{cls.__qualname__}"] = cls
    return found


def test_the_pipeline_names_the_analysis_base():
    """pipeline's MoetuneError is analysis's one base, and TraceError derives from it."""
    assert pipeline_errors.MoetuneError is analysis_errors.MoetuneError
    assert issubclass(analysis_errors.TraceError, pipeline_errors.MoetuneError)


def test_every_project_error_derives_from_the_one_base():
    """Every exception class defined in the project (more than 15, those the issue named among them)
    derives from the one base."""
    classes = error_classes()
    # the walk saw the errors the issue names, and the rest
    for name in ("moetune.analysis.errors.TraceError", "moetune.cli.main.UserError",
                 "moetune.experiment.fit.OneGpuError", "moetune.store.StoreError"):
        assert name in classes
    assert len(classes) > 15
    outside = sorted(n for n, c in classes.items() if not issubclass(c, analysis_errors.MoetuneError))
    assert outside == []


def test_the_command_prints_an_unreadable_trace_as_one_line_exit_2(tmp_path):
    """`moetune analyze` on a file that is not a database exits 2 with one line naming it, no traceback."""
    bad = tmp_path / "trace_0.sqlite"
    bad.write_text("not a database\n")
    r = subprocess.run([sys.executable, "-m", "moetune.cli.main", "analyze", str(bad)],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(bad) in lines[0] and "not an SQLite file" in lines[0]
