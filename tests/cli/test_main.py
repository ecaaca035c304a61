"""cli/main.py, the `moetune` command: what an engineer can fix is one line on stderr and exit code 2, from the real `moetune` command:
a malformed rule table, a database that does not answer, a Megatron venv that cannot run, a
malformed experiment. A bug still shows its traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def moetune(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moetune.cli.main", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env={**os.environ, **(env or {})})


def command_of(argv: list[str]) -> str:
    """The subcommand of a `moetune` argv (after the global --db VALUE)."""
    rest = argv[argv.index("moetune.cli.main") + 1:]
    while rest[0].startswith("--db"):
        rest = rest[1:] if "=" in rest[0] else rest[2:]
    return rest[0]


def one_line(r: subprocess.CompletedProcess, *fragments: str) -> str:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    # every error line has the subcommand's prefix, as the subcommands' own parsers write it
    assert lines[0].startswith(f"moetune {command_of(r.args)}: "), lines[0]
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_malformed_rule_table(tmp_path):
    """A rule table with a bad value names the file, the rule and the value, in one line with exit
    2."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - id: x\n    wall: memory\n    change: {tp: 2}\n    priority: 1\n"
                     "    rationale: r\n    source: s\n    verify: sometimes\n")
    r = moetune("--db", str(tmp_path / "db.sqlite"), "demo", "--runs", str(tmp_path / "runs"),
                "--out", str(tmp_path / "reports"), "--no-progress", env={"MOETUNE_RULES": str(rules)})
    one_line(r, str(rules), "rule x", "verify 'sometimes'")


def test_database_that_does_not_answer(tmp_path):
    # nothing listens on port 1 of this machine: the connection is refused at once
    """A database that refuses the connection is one line naming its host and MOETUNE_DB, without
    the password."""
    r = moetune("status", env={"MOETUNE_DB": "postgresql+psycopg://moetune:secret@127.0.0.1:1/moetune"})
    line = one_line(r, "127.0.0.1:1", "cannot reach the database", "MOETUNE_DB")
    assert "secret" not in line  # the password is not printed


def test_database_url_that_is_no_url(tmp_path):
    """A database URL of no known dialect is one line naming it and MOETUNE_DB."""
    one_line(moetune("status", env={"MOETUNE_DB": "nosuchdialect://x/y"}), "nosuchdialect", "MOETUNE_DB")


def test_megatron_venv_that_cannot_run(tmp_path):
    """A Megatron venv whose python fails is one line carrying its error."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho 'ImportError: no megatron here' >&2\nexit 1\n")
    python.chmod(0o755)
    r = moetune("check", "--gpus", "8", "--", "--num-layers", "8", env={"MEGATRON_VENV": str(tmp_path / "venv")})
    one_line(r, "megatron parser did not run", "no megatron here")


def test_malformed_experiment(tmp_path):
    """A misspelt cluster key in an experiment is one line naming the file, the key and the allowed
    keys."""
    exp = tmp_path / "bad.yaml"
    exp.write_text((REPO / "experiments" / "moe_proxy.yaml").read_text().replace("cluster:", "cluster:\n  gpus_per_nod: 2", 1))
    r = moetune("--db", str(tmp_path / "db.sqlite"), "tune", str(exp), "--executor", "local",
                "--runs", str(tmp_path / "runs"), "--no-progress")
    one_line(r, "bad.yaml", "cluster.gpus_per_nod", "allowed keys")


def test_a_bug_keeps_its_traceback(monkeypatch, capsys):
    """An error that is a bug (a KeyError in a command) is raised with its traceback, not turned
    into one line."""
    from moetune.cli import main as cli
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


@pytest.mark.e2e
@pytest.mark.parametrize("url, says", SECRET_URLS)
def test_no_store_error_shows_the_database_password(tmp_path, url, says):
    """However the store fails (a server that does not answer, a missing driver, a bad URL), from
    MOETUNE_DB or --db: one line, the URL's password as ***; a MySQL URL is told its own driver."""
    no_password(moetune("status", env={"MOETUNE_DB": url}, cwd=tmp_path), url, says)
    no_password(moetune("--db", url, "status", cwd=tmp_path), url, says)


@pytest.mark.e2e
@pytest.mark.parametrize("url, says", SECRET_URLS[:2] + SECRET_URLS[-1:])
def test_no_command_shows_the_database_password(tmp_path, url, says):
    """Every command that opens the store says the same password-free line."""
    for cmd in STORE_COMMANDS:
        no_password(moetune(*cmd, env={"MOETUNE_DB": url}, cwd=tmp_path), url, says)


# ---- the cases a new user meets: each one line, the right exit code, nothing written by a reader ----
def test_plan_baseline_on_too_few_gpus(tmp_path):
    """`plan deepseek_v3 --gpus 256 --gpu-type H100 --baseline`: the baseline's 1024 GPUs named,
    exit 1 as text and as JSON."""
    for fmt in ("text", "json"):
        r = moetune("plan", "deepseek_v3", "--gpus", "256", "--gpu-type", "H100", "--baseline",
                    "--format", fmt, cwd=tmp_path)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip() == "moetune plan: deepseek_v3's baseline needs 1024 GPUs (or a multiple); 256 given"
    for fmt in ("text", "json"):  # does not fit: 1 in both formats
        assert moetune("plan", "qwen3_235b", "--baseline", "--format", fmt, "--pp", "2", "--vpp", "1",
                       "--recompute", "none", cwd=tmp_path).returncode == 1  # the former baseline


@pytest.mark.parametrize("argv", [("plan", "deepseek_v3", "--format", "json"),
                                  ("analyze", "--help")])
def test_a_reader_that_stops_early(tmp_path, argv):
    """`moetune plan ... | head`: the reader closes the pipe; no BrokenPipeError traceback."""
    p = subprocess.Popen([sys.executable, "-m", "moetune.cli.main", *argv], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_analyze_markdown_to_a_reader_that_stops_early(tmp_path):
    """`moetune analyze TRACE --format markdown | head` on a real trace of the demo's bank."""
    trace = REPO / "data" / "trial_bank" / "traces" / "baseline.sqlite.xz"
    p = subprocess.Popen([sys.executable, "-m", "moetune.cli.main", "analyze", str(trace),
                          "--format", "markdown"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=300)
    assert "Traceback" not in err, err


MEGATRON_ARGV = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "8", "--num-experts", "8",
                 "--micro-batch-size", "1", "--global-batch-size", "16"]


def test_check_takes_megatrons_dispatcher_default(tmp_path):
    """No --moe-token-dispatcher-type: Megatron runs allgather, which refuses EP overlap."""
    r = moetune("check", "--no-megatron-parser", "--gpus", "16", "--", *MEGATRON_ARGV,
                "--expert-model-parallel-size", "8", "--overlap-moe-expert-parallel-comm", cwd=tmp_path)
    assert r.returncode == 1 and "ep_overlap_dispatcher" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("gpus", ["0", "-4"])
def test_check_refuses_no_gpus(tmp_path, gpus):
    """`moetune check` with no GPUs (or fewer) says give 1 GPU or more, exit 2."""
    r = moetune("check", "--gpus", gpus, "--", *MEGATRON_ARGV, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr == f"moetune check: --gpus {gpus}: give 1 GPU or more\n", r.stderr


def test_check_refuses_fp8_without_fp8_hardware(tmp_path):
    """FP8 on an A100 is refused by the hardware rule; on an H100 it is not."""
    r = moetune("check", "--no-megatron-parser", "--gpu-type", "A100", "--", *MEGATRON_ARGV,
                "--transformer-impl", "transformer_engine", "--fp8-format", "hybrid", cwd=tmp_path)
    assert r.returncode == 1 and "fp8_needs_hopper_or_newer" in r.stdout, r.stdout + r.stderr
    r = moetune("check", "--no-megatron-parser", "--gpu-type", "H100", "--", *MEGATRON_ARGV,
                "--transformer-impl", "transformer_engine", "--fp8-format", "hybrid", cwd=tmp_path)
    assert "fp8_needs_hopper_or_newer" not in r.stdout


def test_unwritable_runs_or_reports_folder_before_the_study(tmp_path):
    """A runs or reports folder that cannot take a file (here: below a plain file, which holds for
    root too): one line, exit 2, before any trial ran."""
    blocker = tmp_path / "afile"
    blocker.write_text("")
    db = tmp_path / "db.sqlite"
    for flag in ("--runs", "--out"):
        r = moetune("--db", str(db), "demo", flag, str(blocker / "x"), "--no-progress", cwd=tmp_path)
        one_line(r, str(blocker / "x"), "cannot be written", flag)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_read_only_runs_folder(tmp_path):
    """A runs folder that cannot be written stops the command before the study, in one line naming
    it."""
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o555)
    r = moetune("--db", str(tmp_path / "db.sqlite"), "demo", "--runs", str(runs), "--no-progress", cwd=tmp_path)
    one_line(r, str(runs), "cannot be written")


@pytest.mark.e2e
def test_reading_commands_write_nothing(tmp_path):
    """status and report on a missing path, a non-URL, a folder that does not exist, or an unrelated
    SQLite file: nothing created, the foreign file unchanged."""
    r = moetune("status", env={"MOETUNE_DB": "notaurl"}, cwd=tmp_path)
    assert r.returncode == 0 and "no studies" in r.stdout and not (tmp_path / "notaurl").exists()
    r = moetune("--db", str(tmp_path / "no" / "dir" / "x.db"), "status", cwd=tmp_path)
    assert r.returncode == 0 and not (tmp_path / "no").exists()
    one_line(moetune("--db", str(tmp_path / "no" / "x.db"), "report", cwd=tmp_path), "no moetune store")
    assert not (tmp_path / "no").exists() and not (tmp_path / "reports").exists()
    import sqlite3
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as c:
        c.execute("create table mine(a)")
    before = other.read_bytes()
    one_line(moetune("--db", str(other), "status", cwd=tmp_path), "not a moetune store", "mine")
    one_line(moetune("--db", str(other), "report", cwd=tmp_path), "not a moetune store")
    assert other.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["other.sqlite"]


def test_tune_and_fit_refuse_a_layout_before_any_job(tmp_path):
    """EP 3 with 16 experts, TP 7: the constraint table refuses them; one line, exit 2, no trial."""
    db = tmp_path / "db.sqlite"
    one_line(moetune("--db", str(db), "fit", "moe_proxy", "--ep", "3", "--executor", "local",
                     "--runs", str(tmp_path / "runs"), cwd=tmp_path), "EP3", "refused before any job")
    one_line(moetune("--db", str(db), "fit", "moe_proxy", "--tp", "7", "--executor", "local",
                     "--runs", str(tmp_path / "runs"), cwd=tmp_path), "TP7", "refused before any job")
    exp = tmp_path / "ep3.yaml"
    exp.write_text((REPO / "experiments" / "moe_proxy.yaml").read_text().replace("ep: 2", "ep: 3", 1))
    assert "ep: 3" in exp.read_text()
    one_line(moetune("--db", str(db), "tune", str(exp), "--executor", "local", "--runs", str(tmp_path / "runs"),
                     "--no-progress", cwd=tmp_path), "ep3.yaml", "EP3")
    assert not (tmp_path / "runs").exists()


def test_stage_says_what_it_did_and_fit_exits_by_its_verdict(tmp_path):
    """`stage fit` exits 1 when its fit.json says the layout does not fit, 2 when a rank could not
    measure (no Megatron here), 0 when it fits; run again without --force it says the stage is
    current instead of only printing a path."""
    import json
    db = ["--db", str(tmp_path / "db.sqlite")]
    r = moetune(*db, "fit", "moe_proxy", "--executor", "local", "--runs", str(tmp_path / "runs"), cwd=tmp_path)
    fitted = json.loads(next((tmp_path / "runs").rglob("fit.json")).read_text())
    expect = 0 if fitted["fits"] else 1 if fitted["failure"] in (None, "oom") else 2
    assert r.returncode == expect, r.stderr
    r = moetune(*db, "stage", "fit", "--trial", "1", cwd=tmp_path)
    assert r.returncode == expect and "is current" in r.stdout and f"fit: {fitted['reason']}" in r.stdout
    r = moetune(*db, "stage", "fit", "--trial", "1", "--force", cwd=tmp_path)
    assert r.returncode == expect and "ran; it wrote 1 file" in r.stdout


def test_tune_that_measured_nothing_exits_1(tmp_path):
    """A study stopped before any trial measured a step time (here: the demo's bank holds no run
    of the baseline) says why on stderr and exits 1, not 0 with `best ? ms/step`."""
    bank = tmp_path / "bank"
    bank.mkdir()
    (bank / "bank.jsonl").write_text("")
    r = subprocess.run([sys.executable, "-m", "moetune.cli.main", "demo", "--bank", str(bank),
                        "--no-progress"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert "moetune demo: no trial measured a step time; stopped: baseline trial did not complete" in r.stderr


def test_version_is_the_packages(tmp_path):
    """`moetune --version` prints moetune.__version__, exit 0."""
    from moetune import __version__
    r = moetune("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"moetune {__version__}", r.stdout + r.stderr


def test_top_level_help_says_plans_default_order(tmp_path):
    """The plan line of `moetune --help` names its default order (speed), not memory's."""
    r = moetune("--help", cwd=tmp_path)
    text = " ".join(r.stdout.split())
    assert r.returncode == 0 and "fastest predicted first" in text and "least model parallelism" not in text


def test_a_name_that_is_a_path_writes_nothing(tmp_path):
    """`name: ../../etc/evil` in an experiment: one line naming the file and the key, exit 2, and
    no lock, runs or reports folder written anywhere."""
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    exp = work / "evil.yaml"
    text = (REPO / "experiments" / "moe_proxy.yaml").read_text()
    exp.write_text(text.replace("name: moe_proxy", "name: ../../etc/evil", 1))
    for cmd in ("tune", "fit"):
        one_line(moetune("--db", str(work / "db.sqlite"), cmd, str(exp), "--executor", "local", cwd=work),
                 "evil.yaml: name '../../etc/evil'", "letters, digits")
    assert sorted(p.name for p in work.iterdir()) == ["evil.yaml"] and sorted(tmp_path.rglob("*")) == [
        tmp_path / "a", work, exp]


@pytest.mark.parametrize("cmd", ["report", "status"])
def test_a_study_name_that_is_a_path_is_refused(tmp_path, cmd):
    """A study named on the command line is checked as a name: one line, exit 2, nothing written."""
    one_line(moetune(cmd, "../x", cwd=tmp_path), "study '../x'", "letters, digits")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag, value", [("--pp", "0"), ("--micro-batch", "0"), ("--tp", "-1")])
def test_fit_refuses_layout_flags_below_one(tmp_path, flag, value):
    """`fit --pp 0`, `--micro-batch 0`, `--tp -1`: a usage error saying give 1 or more, exit 2,
    before any store or trial."""
    r = moetune("fit", "moe_proxy", flag, value, "--executor", "local", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"argument {flag}: {value}: give 1 or more" in r.stderr.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("db", ["sqlite:///relative.db", None])
def test_reading_commands_make_no_store(tmp_path, db):
    """With MOETUNE_DB=sqlite:///relative.db, or the default store path, and no store there:
    status says there is none, report refuses in one line, plan plans; none creates a file or folder."""
    env = {"MOETUNE_DB": db} if db else {}
    clean = {k: v for k, v in os.environ.items() if k != "MOETUNE_DB"}

    def run(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "moetune.cli.main", *a], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env={**clean, **env})

    r = run("status")
    assert r.returncode == 0 and "no studies" in r.stdout and "no moetune store here" in r.stdout, r.stdout + r.stderr
    one_line(run("report"), "no moetune store here")
    assert run("plan", "moe_proxy").returncode == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cmd", ["demo", "tune"])
@pytest.mark.parametrize("flag, value", [("--max-trials", "0"), ("--max-trials", "-3"),
                                         ("--max-gpu-hours", "0"), ("--max-gpu-hours", "nan")])
def test_a_budget_below_one_is_a_usage_error(tmp_path, cmd, flag, value):
    """`--max-trials 0` or `-3`, `--max-gpu-hours 0`: a usage error, exit 2, before any store,
    trial or folder."""
    r = moetune(cmd, *(["moe_proxy"] if cmd == "tune" else []), flag, value, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"argument {flag}: {value}: give " in r.stderr.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.e2e
def test_the_demo_goes_on_when_its_budget_is_raised(tmp_path):
    """`demo --max-trials 1` then `--max-trials 1` says why it runs nothing; `--max-trials 5` resumes
    it to the demo's end (3 trials, best 253.5 ms). The baseline is charged its whole recorded job,
    74 s on 2 GPUs."""
    def demo(*flags):
        return moetune("--db", str(tmp_path / "db.sqlite"), "demo", "--no-progress", *flags, cwd=tmp_path)
    first = demo("--max-trials", "1")
    assert first.returncode == 0, first.stderr
    status = moetune("--db", str(tmp_path / "db.sqlite"), "status", cwd=tmp_path).stdout
    assert f"GPU-hours spent: {74 * 2 / 3600:.3f} (trials' jobs {74 * 2 / 3600:.3f}, fits 0.000, " \
           "preflight 0.000); trials' jobs counted by the replayed bank entry's recorded job time" in status
    same = demo("--max-trials", "1")
    assert same.stdout.splitlines()[0] == ("study moe_proxy-replay stopped earlier: trial budget spent "
                                           "(1 of 1); raise --max-trials or tuning.budget_trials to go on")
    more = demo("--max-trials", "5")
    assert more.returncode == 0, more.stderr
    assert "study moe_proxy-replay: 3 trials, best 253.5 ms/step" in more.stdout
    assert "stopped earlier" not in more.stdout
    status = moetune("--db", str(tmp_path / "db.sqlite"), "status", cwd=tmp_path).stdout
    assert " resume " in status and "the budget was raised to 5 trials" in status


def test_a_tune_its_preflight_stopped_says_no_trial_ran_and_why(tmp_path, monkeypatch, capsys):
    """A tune stopped before its first trial (the preflight): one stderr line saying no trial ran
    and the stop's reason, exit 1; no `best ? ms/step` line."""
    from moetune.cli import main as cli
    from moetune.tune import loop
    why = "preflight of cluster device-h200x2 (job 7): no GPU visible to the job"
    monkeypatch.setattr(loop, "tune", lambda *a, **k: {"study": "moe_proxy", "trials": 0, "trials_total": 0,
                                                        "best_judged_step_time_ms": None, "stop_reason": why})
    monkeypatch.setattr(cli, "_write_reports", lambda args, study: ("r.md", "r.html"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--db", str(tmp_path / "db.sqlite"), "tune", "moe_proxy", "--executor", "local",
                     "--runs", str(tmp_path / "runs"), "--no-progress"]) == 1
    out = capsys.readouterr()
    assert "?" not in out.out and "report: r.md" in out.out
    assert out.err == f"moetune tune: study moe_proxy: no trial ran; stopped: {why}\n"


def test_tune_refuses_a_baseline_that_does_not_fit_unless_forced(tmp_path, capsys, monkeypatch):
    """A baseline the estimate says does not fit is one line, exit 2, before any folder or job:
    the plan's fitting layouts offered; --force goes on (here to the tuner, stood in for)."""
    from tests.cli.test_render import _former_qwen3_235b

    from moetune.cli import main as cli
    from moetune.tune import loop
    monkeypatch.chdir(tmp_path)
    path = str(_former_qwen3_235b(tmp_path))
    capsys.readouterr()
    assert cli.main(["tune", path, "--runs", "runs", "--out", "reports"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "does not fit by the estimate" in line and "--force" in line and "fitting layouts" in line
    assert not (tmp_path / "runs").exists()
    ran = []
    monkeypatch.setattr(loop, "tune", lambda exp, store, **kw: ran.append(exp.name) or {"study": "x"})
    monkeypatch.setattr(cli, "_write_reports", lambda args, study: ("r.md", "r.html"))
    cli.main(["tune", path, "--runs", "runs", "--out", "reports", "--force"])
    assert ran == ["qwen3_235b"] and "warning: " in capsys.readouterr().err
