"""moetune/settings.py and moetune/analysis/settings.py: every environment variable moetune reads is named
once, with its default and what it sets, and is read when it is used, so a variable set after
moetune was imported still takes effect (the store, the rule table, the trial bank, the Megatron
venv, nsys). A value outside a variable's allowed set is one line naming the variable and the
values it takes, from the function and from the real `moetune analyze` command. No other module's
code touches the environment, except the scripts that run inside the job without moetune."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moetune.analysis import analyze, settings as analysis_settings
from moetune.analysis.errors import MoetuneError, SettingError
from moetune.analysis.nsys import nsys_binary
from moetune import settings
from moetune.decide import rules
from moetune.job import replay
from moetune.experiment import megatron_validate
from moetune.store import Store

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "tests/data/cpu/steps_nvtx_osrt.sqlite.xz"  # a real nsys 2022.4 recording


def test_each_variable_is_named_once_with_a_doc():
    """Each environment variable is declared once across both settings modules, with a one-line doc."""
    names = [*settings.SETTINGS, *analysis_settings.SETTINGS]
    assert len(names) == len(set(names))
    for s in [*settings.SETTINGS.values(), *analysis_settings.SETTINGS.values()]:
        assert s.doc and "\n" not in s.doc, s.name


def test_the_store_follows_moetune_db_set_after_import(tmp_path, monkeypatch):
    """MOETUNE_DB set now (the store module was imported long before) picks the database."""
    monkeypatch.setenv("MOETUNE_DB", str(tmp_path / "later.db"))
    store = Store(None)
    assert store.url == f"sqlite:///{tmp_path / 'later.db'}"
    assert (tmp_path / "later.db").exists()
    monkeypatch.delenv("MOETUNE_DB")
    assert settings.db() == ".moetune/moetune.db"


def test_the_rule_table_follows_moetune_rules_set_after_import(tmp_path, monkeypatch):
    """A team's table named after import is the one loaded: its own error names its own file."""
    own = tmp_path / "team_rules.yaml"
    own.write_text("rules:\n  - id: x\n    wall: memory\n    change: {tp: 2}\n    priority: 1\n"
                   "    rationale: r\n    source: s\n    verify: sometimes\n")
    shipped = len(rules.load_rules())
    monkeypatch.setenv("MOETUNE_RULES", str(own))
    with pytest.raises(MoetuneError, match=re.escape(str(own))):
        rules.load_rules()
    monkeypatch.delenv("MOETUNE_RULES")
    assert len(rules.load_rules()) == shipped > 0


def test_the_demo_bank_follows_moetune_bank_set_after_import(tmp_path, monkeypatch):
    """MOETUNE_BANK set after import changes the bank the replay reads."""
    checkout = REPO / "data" / "trial_bank"
    entries = [line for line in (checkout / "bank.jsonl").read_text().splitlines() if line.strip()]
    monkeypatch.setenv("MOETUNE_BANK", str(tmp_path))
    with pytest.raises(replay.ReplayError, match=re.escape(str(tmp_path / "bank.jsonl"))):
        replay.load_bank()
    monkeypatch.setenv("MOETUNE_BANK", str(checkout))
    assert len(replay.load_bank()) == len(entries)


def test_the_megatron_venv_follows_megatron_venv_set_after_import(tmp_path, monkeypatch):
    """MEGATRON_VENV set after import changes the venv Megatron validation uses, and a missing one is
    named."""
    monkeypatch.setenv("MEGATRON_VENV", str(tmp_path / "venv"))
    assert not megatron_validate.available()
    with pytest.raises(megatron_validate.MegatronUnavailable, match=re.escape(str(tmp_path / "venv"))):
        megatron_validate.subprocess_env()


def test_nsys_follows_moetune_nsys_set_after_import(tmp_path, monkeypatch):
    """MOETUNE_NSYS set after import changes the nsys binary used."""
    monkeypatch.setenv("MOETUNE_NSYS", str(tmp_path / "nsys"))
    assert nsys_binary() == str(tmp_path / "nsys")


def test_a_child_process_gets_this_environment_with_the_changes(monkeypatch):
    """A child's environment is this process's with the given changes applied."""
    monkeypatch.setenv("MOETUNE_SETTINGS_PROBE", "seen")
    env = settings.environ(CUDA_VISIBLE_DEVICES="")
    assert env["MOETUNE_SETTINGS_PROBE"] == "seen" and env["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize("workers", [1, 2])
def test_an_unknown_trace_reader_is_one_line_naming_the_variable_and_its_values(monkeypatch, workers):
    """An unknown MOETUNE_TRACE_READER is a one-line SettingError naming the variable, its value and the
    allowed values, with any worker count."""
    monkeypatch.setenv("MOETUNE_TRACE_READER", "pandas")
    with pytest.raises(SettingError) as e:
        analyze([TRACE], workers=workers)
    line = str(e.value)
    assert len(line.splitlines()) == 1
    assert "MOETUNE_TRACE_READER='pandas'" in line and "connectorx, sqlite3" in line


def test_the_command_refuses_an_unknown_trace_reader_in_one_line():
    """`moetune analyze` with an unknown trace reader exits 2 with that one line, no traceback."""
    r = subprocess.run([sys.executable, "-m", "moetune.cli.main", "analyze", str(TRACE)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MOETUNE_TRACE_READER": "sqlite"})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "MOETUNE_TRACE_READER='sqlite'" in lines[0] and "connectorx, sqlite3" in lines[0]


# The modules whose own code may touch the environment: the two settings modules, and the programs
# run by their path in another interpreter, where moetune is not installed to ask: the two
# workloads and the two probes inside the job (the preflight reports what the job got), and
# Megatron's parse in its own venv (each checked job's environment set as the job has it).
READERS = {"moetune/analysis/settings.py", "moetune/settings.py",
           "moetune/workloads/train_moe.py", "moetune/workloads/fake_fill.py", "moetune/workloads/cpu_workload.py",
           "moetune/workloads/preflight_probe.py", "moetune/workloads/link_probe.py", "moetune/experiment/megatron_child.py"}
OS_ENV = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def touches_environment(tree: ast.AST) -> bool:
    """os.environ, os.getenv and the like, or the same imported from os, anywhere in the code."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "os" and node.attr in OS_ENV:
                return True
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if {a.name for a in node.names} & OS_ENV:
                return True
    return False


def test_only_the_settings_modules_and_in_job_scripts_read_the_environment():
    """No module outside the settings modules and the in-job scripts reads the environment."""
    found = {str(path.relative_to(REPO))
             for path in sorted([*REPO.glob("moetune/**/*.py"), *REPO.glob("analysis/**/*.py")])
             if touches_environment(ast.parse(path.read_text()))}
    assert found - READERS == set()
    assert {"moetune/settings.py", "moetune/analysis/settings.py"} <= found  # the walk sees a read
