"""The store on SQLite and on a real PostgreSQL server (Debian's, started here), and migrations."""
import glob
import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest

from moetune.store import SCHEMA_VERSION, DuplicateTrial, Store, StoreError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url(tmp_path_factory):
    """A throwaway PostgreSQL cluster on a free local port, run as the postgres user."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("a throwaway PostgreSQL cluster needs root (to run it as the postgres user)")
    if not bins and shutil.which("apt-get"):  # Debian's server package, installed once
        subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=900", "install", "-y", "-q", "postgresql"],
                       capture_output=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        pytest.skip("Debian's postgresql package is not installed and apt-get could not install it")
    bindir = os.path.dirname(bins[-1])
    data = Path(tempfile.mkdtemp(prefix="moetune-pg-"))  # pytest's tmp is root-only
    shutil.chown(data, "postgres", "postgres")
    os.chmod(data, 0o700)
    port = _free_port()
    run = lambda *cmd: subprocess.run(["runuser", "-u", "postgres", "--", *cmd], check=True,
                                      capture_output=True, text=True)
    run(f"{bindir}/initdb", "-D", str(data / "db"), "-A", "trust", "-U", "postgres")
    run(f"{bindir}/pg_ctl", "-D", str(data / "db"), "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
        "-l", str(data / "log"), "-w", "start")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(["runuser", "-u", "postgres", "--", f"{bindir}/pg_ctl", "-D", str(data / "db"),
                        "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def _exercise(store: Store) -> None:
    study = store.create_study("s", "moe_proxy", {"k": [1, 2]})
    assert store.create_study("s", "moe_proxy").id == study.id  # idempotent
    t1 = store.add_trial(study.id, {"ep": 2}, "h1")
    t2 = store.add_trial(study.id, {"ep": 4}, "h2", parent_id=t1.id, fix="raise_ep")
    assert (t1.number, t2.number) == (1, 2)
    with pytest.raises(DuplicateTrial):
        store.add_trial(study.id, {"ep": 2}, "h1")
    store.update_trial(t1.id, state="completed", step_time_ms=812.5, job_id="42")
    assert store.trial(t1.id).step_time_ms == 812.5
    assert store.trial_by_hash(study.id, "h2").id == t2.id
    store.record_stage(t1.id, "render", "abc", ["job.sh"])
    store.record_stage(t1.id, "render", "def", ["job.sh"], status="failed", error="boom")
    assert store.last_stage(t1.id, "render").inputs_hash == "abc"
    store.set_metrics(t1.id, {"gpu_idle_share": 0.4, "wall": "x", "steps": 3})
    store.set_metrics(t1.id, {"gpu_idle_share": 0.5})
    assert store.metrics(t1.id) == {"gpu_idle_share": 0.5}
    # `replace` names the metrics a writer owns: the others (another writer's) stay
    store.set_metrics(t1.id, {"gpu_hours": 0.25, "gpu_idle_share": 0.6})
    store.set_metrics(t1.id, {"gpu_idle_share": 0.7}, replace={"gpu_idle_share", "steps"})
    assert store.metrics(t1.id) == {"gpu_hours": 0.25, "gpu_idle_share": 0.7}
    store.add_decision(study.id, "keep", "faster by 12%", t2.id, "raise_ep", {"delta": 0.12})
    d = store.decisions(study.id)
    assert d[0].evidence == {"delta": 0.12} and d[0].rule == "raise_ep"
    with pytest.raises(StoreError, match="no trial 999"):
        store.trial(999)


def test_sqlite_store(tmp_path):
    """The store's operations work on SQLite, in WAL mode."""
    store = Store(str(tmp_path / "m.db"))
    _exercise(store)
    mode = sqlite3.connect(tmp_path / "m.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


@pytest.mark.postgres
def test_postgres_store(postgres_url):
    """The store's operations work on PostgreSQL."""
    _exercise(Store(postgres_url))


def test_env_url(tmp_path, monkeypatch):
    """MOETUNE_DB names the store when none is given."""
    monkeypatch.setenv("MOETUNE_DB", str(tmp_path / "env.db"))
    assert Store().url.endswith("env.db")


def test_old_database_stays_readable(tmp_path):
    """A database without the meta table (version 0) is brought up to date, data kept."""
    path = tmp_path / "old.db"
    store = Store(str(path))
    study = store.create_study("kept", "m")
    con = sqlite3.connect(path)
    con.execute("DROP TABLE moetune_meta")
    con.commit()
    con.close()
    again = Store(str(path))
    assert again.schema_version() == SCHEMA_VERSION
    assert again.study("kept").id == study.id


def test_newer_database_refused(tmp_path):
    """A database with a newer schema version is refused as newer than this moetune."""
    path = tmp_path / "new.db"
    Store(str(path))
    con = sqlite3.connect(path)
    con.execute("UPDATE moetune_meta SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="newer than this moetune"):
        Store(str(path))


def test_frozen_v1_database_stays_readable(tmp_path):
    """tests/data/store_v1.sql: a store written at schema version 1, frozen. Today's Store opens it,
    reads every table and writes to it (a schema change without a migration fails here)."""
    path = tmp_path / "v1.db"
    con = sqlite3.connect(path)
    con.executescript((Path(__file__).resolve().parents[1] / "data" / "store_v1.sql").read_text())
    con.close()
    store = Store(str(path))
    assert store.schema_version() == SCHEMA_VERSION
    study = store.study("qwen3_30b_a3b-h100")
    assert study.experiment == {"tuning": {"budget_trials": 8}}
    t1, t2 = store.trials(study.id)
    assert (t1.state, t1.job_id, t1.step_time_ms, t1.wall) == ("completed", "4242", 1234.5, "communication")
    assert (t2.parent_id, t2.fix, t2.config) == (t1.id, "lower_ep_within_nvlink", {"tp": 1, "ep": 8})
    assert store.metrics(t1.id) == {"exposed_a2a_share": 0.31, "gpu_idle_share": 0.12}
    assert store.last_stage(t1.id, "analyze").outputs == ["analysis.json"]
    (d,) = store.decisions(study.id)
    assert (d.kind, d.trial_id, d.evidence) == ("apply", t2.id, {"exposed_a2a_share": 0.31})
    t3 = store.add_trial(study.id, {"tp": 2, "ep": 8}, "new-hash", parent_id=t2.id)
    assert t3.number == 3


def test_messages_hide_the_password_as_written_and_decoded():
    """One helper masks the URL every message names, SQLAlchemy's parse or not, and takes the
    password out of a driver's own text, percent-encoded or not."""
    from moetune.store import hide_password, masked
    assert masked("postgresql+psycopg://bob:s3cr%40t@db:5432/m") == "postgresql+psycopg://bob:***@db:5432/m"
    assert masked("::://bob:s3cret@db/m") == "::://bob:***@db/m"  # no URL to SQLAlchemy
    assert masked("postgresql+psycopg://bob@db/m") == "postgresql+psycopg://bob@db/m"
    url = "postgresql+psycopg://bob:s3cr%40t@db/m"
    assert hide_password("auth failed for s3cr@t (s3cr%40t)", url) == "auth failed for *** (***)"


def test_frozen_v1_database_reads_read_only_with_its_job_ids(tmp_path):
    """A read-only open of the frozen v1 store (tests/data/store_v1.sql) leaves it at version 1 and
    reads each trial's job id (Trial.job_id) from the column that store names slurm_job_id."""
    path = tmp_path / "v1.db"
    con = sqlite3.connect(path)
    con.executescript((Path(__file__).resolve().parents[1] / "data" / "store_v1.sql").read_text())
    con.close()
    store = Store(str(path), read_only=True)
    assert store.schema_version() == 1
    t1, _ = store.trials(store.study("qwen3_30b_a3b-h100").id)
    assert t1.job_id == "4242"


def test_calibrations_are_kept_per_cluster_and_a_v2_store_reads_without_them(tmp_path):
    """The latest calibration of a cluster is its newest row; a store of schema 2 (no calibrations
    table) opened read-only stays at 2 and has none, and opened to write it gains the table."""
    path = tmp_path / "v2.db"
    store = Store(str(path))
    store.add_calibration("c1", "H100", {"rows": [1]}, job_id="1")
    store.add_calibration("c2", "H200", {"rows": [2]})
    store.add_calibration("c1", "H100", {"rows": [3]}, job_id="3")
    assert store.latest_calibration("c1").record == {"rows": [3]} and store.latest_calibration("none") is None
    con = sqlite3.connect(path)
    con.execute("DROP TABLE calibrations")
    con.execute("UPDATE moetune_meta SET value='2' WHERE key='schema_version'")
    con.commit()
    con.close()
    old = Store(str(path), read_only=True)
    assert old.schema_version() == 2 and old.latest_calibration("c1") is None
    again = Store(str(path))
    assert again.schema_version() == SCHEMA_VERSION == 3
    assert again.add_calibration("c1", "H100", {"rows": [4]}).id == again.latest_calibration("c1").id


@pytest.mark.parametrize("url", ["sqlite:///relative.db", "sqlite:///sub/dir/x.db", "sqlite+pysqlite:///r.db"])
def test_a_read_only_open_of_a_missing_sqlite_url_creates_nothing(tmp_path, monkeypatch, url):
    """A SQLite URL whose file is not there: a read-only open is NoStore, one line naming the URL,
    and no file or folder is made (a connection would create an empty database)."""
    from moetune.store import NoStore
    monkeypatch.chdir(tmp_path)
    with pytest.raises(NoStore, match="no moetune store here") as err:
        Store(url, read_only=True)
    assert url in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_open_of_an_existing_sqlite_url_reads(tmp_path, monkeypatch):
    """The same URL, once a store is there, opens read-only and reads its studies."""
    monkeypatch.chdir(tmp_path)
    Store("sqlite:///relative.db").create_study("s", "m")
    assert [s.name for s in Store("sqlite:///relative.db", read_only=True).studies()] == ["s"]
