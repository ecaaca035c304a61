"""What an engineer can fix is one line on stderr and exit code 2, from the real `moetune` command:
a malformed rule table, a database that does not answer, a Megatron venv that cannot run, a
malformed experiment. A bug still shows its traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def moetune(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moetune.pipeline.cli.main", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env={**os.environ, **(env or {})})


def one_line(r: subprocess.CompletedProcess, *fragments: str) -> str:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("moetune: "), lines[0]
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_malformed_rule_table(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - id: x\n    wall: memory\n    change: {tp: 2}\n    priority: 1\n"
                     "    rationale: r\n    source: s\n    verify: sometimes\n")
    r = moetune("--db", str(tmp_path / "db.sqlite"), "demo", "--runs", str(tmp_path / "runs"),
                "--out", str(tmp_path / "reports"), "--no-progress", env={"MOETUNE_RULES": str(rules)})
    one_line(r, str(rules), "rule x", "verify 'sometimes'")


def test_database_that_does_not_answer(tmp_path):
    # nothing listens on port 1 of this machine: the connection is refused at once
    r = moetune("status", env={"MOETUNE_DB": "postgresql+psycopg://moetune:secret@127.0.0.1:1/moetune"})
    line = one_line(r, "127.0.0.1:1", "cannot reach the database", "MOETUNE_DB")
    assert "secret" not in line  # the password is not printed


def test_database_url_that_is_no_url(tmp_path):
    one_line(moetune("status", env={"MOETUNE_DB": "nosuchdialect://x/y"}), "nosuchdialect", "MOETUNE_DB")


def test_megatron_venv_that_cannot_run(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho 'ImportError: no megatron here' >&2\nexit 1\n")
    python.chmod(0o755)
    r = moetune("check", "--gpus", "8", "--", "--num-layers", "8", env={"MEGATRON_VENV": str(tmp_path / "venv")})
    one_line(r, "megatron parser did not run", "no megatron here")


def test_malformed_experiment(tmp_path):
    exp = tmp_path / "bad.yaml"
    exp.write_text((REPO / "experiments" / "moe_proxy.yaml").read_text().replace("cluster:", "cluster:\n  gpus_per_nod: 2", 1))
    r = moetune("--db", str(tmp_path / "db.sqlite"), "tune", str(exp), "--executor", "local",
                "--runs", str(tmp_path / "runs"), "--no-progress")
    one_line(r, "bad.yaml", "cluster.gpus_per_nod", "allowed keys")


def test_a_bug_keeps_its_traceback(monkeypatch, capsys):
    from moetune.pipeline.cli import main as cli
    monkeypatch.setattr(cli, "cmd_status", lambda args, rest: {}["missing"])
    with pytest.raises(KeyError):
        cli.main(["--db", "sqlite://", "status"])


PASSWORD = "pw-Planted-9f2"
# (URL with the password planted, what its one line says)
SECRET_URLS = [
    (f"postgresql+psycopg://bob:{PASSWORD}@127.0.0.1:1/moetune", "cannot reach the database"),
    (f"postgresql+psycopg2://bob:{PASSWORD}@127.0.0.1:1/moetune", "its driver is not installed (psycopg2)"),
    (f"mysql://bob:{PASSWORD}@127.0.0.1:1/moetune", "pip install mysqlclient"),
    (f"mysql+pymysql://bob:{PASSWORD}@127.0.0.1:1/moetune", "pip install pymysql"),
    (f"nosuchdialect://bob:{PASSWORD}@127.0.0.1:1/moetune", "not a database URL"),
    (f"::://bob:{PASSWORD}@127.0.0.1:1/moetune", "not a database URL"),
]
# every command that opens the store
STORE_COMMANDS = [("status",), ("report",), ("tune", "moe_proxy", "--executor", "local", "--no-progress"),
                  ("demo", "--no-progress"), ("plan", "moe_proxy"), ("stage", "render", "--trial", "1"),
                  ("fit", "moe_proxy", "--executor", "local")]


def no_password(r: subprocess.CompletedProcess, url: str, says: str) -> None:
    assert PASSWORD not in r.stdout + r.stderr, r.stdout + r.stderr
    line = one_line(r, says, "bob:***@")
    assert not url.startswith("mysql") or "postgres" not in line, line


@pytest.mark.parametrize("url, says", SECRET_URLS)
def test_no_store_error_shows_the_database_password(tmp_path, url, says):
    """However the store fails (a server that does not answer, a missing driver, a bad URL), from
    MOETUNE_DB or --db: one line, the URL's password as ***; a MySQL URL is told its own driver."""
    no_password(moetune("status", env={"MOETUNE_DB": url}, cwd=tmp_path), url, says)
    no_password(moetune("--db", url, "status", cwd=tmp_path), url, says)


@pytest.mark.parametrize("url, says", SECRET_URLS[:2] + SECRET_URLS[-1:])
def test_no_command_shows_the_database_password(tmp_path, url, says):
    """Every command that opens the store says the same password-free line."""
    for cmd in STORE_COMMANDS:
        no_password(moetune(*cmd, env={"MOETUNE_DB": url}, cwd=tmp_path), url, says)
