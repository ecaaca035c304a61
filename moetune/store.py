"""The study store: studies, trials, stage runs, metrics and decisions (SQLAlchemy).

SQLite file by default (WAL mode, every write in one transaction); any SQLAlchemy URL by
`MOETUNE_DB` (settings.py) (PostgreSQL for a team). Old databases are brought up to date by `MIGRATIONS`.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    inspect,
    make_url,
    select,
    text,
)
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from moetune import settings
from moetune.errors import MoetuneError

CONNECT_TIMEOUT_S = 10  # a server that does not answer is an error, not a hang


def _connect_args(url: str) -> dict:
    return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}} if url.startswith("postgresql") else {}


class StoreError(MoetuneError):
    """A store problem an engineer can act on (one line)."""


class DuplicateTrial(StoreError):
    pass


class NoStore(StoreError):
    """A command that only reads found no store where it looked (and made none)."""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Base(DeclarativeBase):
    pass


class Meta(Base):
    __tablename__ = "moetune_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Study(Base):
    __tablename__ = "studies"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    model: Mapped[str] = mapped_column(String(200))
    experiment: Mapped[dict] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(32), default="running")
    created_at: Mapped[str] = mapped_column(String(32), default=now)


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("study_id", "config_hash"),
                      UniqueConstraint("study_id", "number"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"))
    number: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict] = mapped_column(JSON)
    config_hash: Mapped[str] = mapped_column(String(64))
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id"), nullable=True)
    fix: Mapped[str | None] = mapped_column(String(100), nullable=True)
    state: Mapped[str] = mapped_column(String(32), default="pending")
    # the scheduler's id of the trial's job: a Slurm job id, or a local job's process id; stored
    # in the column the first schema named slurm_job_id, so older stores read as they are
    job_id: Mapped[str | None] = mapped_column("slurm_job_id", String(64), nullable=True)
    folder: Mapped[str | None] = mapped_column(Text, nullable=True)
    submitted_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    started_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    ended_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    step_time_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    step_time_std_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tflops_per_gpu: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_memory_gb: Mapped[float | None] = mapped_column(Float, nullable=True)
    wall: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[str] = mapped_column(String(32), default=now)


class StageRun(Base):
    __tablename__ = "stage_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"))
    stage: Mapped[str] = mapped_column(String(32))
    inputs_hash: Mapped[str] = mapped_column(String(64))
    outputs: Mapped[list] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(String(16))  # ok | failed | skipped
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[str] = mapped_column(String(32), default=now)
    ended_at: Mapped[str | None] = mapped_column(String(32), nullable=True)


class Metric(Base):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"))
    name: Mapped[str] = mapped_column(String(100))
    rank: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: combined
    value: Mapped[float] = mapped_column(Float)


class Decision(Base):
    __tablename__ = "decisions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"))
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id"), nullable=True)
    kind: Mapped[str] = mapped_column(String(32))  # one of tune/state.py DECISION_KINDS
    rule: Mapped[str | None] = mapped_column(String(100), nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[str] = mapped_column(String(32), default=now)


class Preflight(Base):
    """What a preflight job found on a cluster and image (moetune/workloads/preflight_probe.py), and
    what it means (moetune/experiment/preflight.py); the latest per (cluster, image) is the current one."""
    __tablename__ = "preflights"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(200), index=True)
    image: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(64))  # the cluster keys that shape what it saw
    record: Mapped[dict] = mapped_column(JSON, default=dict)
    problems: Mapped[list] = mapped_column(JSON, default=list)
    blocking: Mapped[int] = mapped_column(Integer, default=0)  # how many problems block trials
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    folder: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[str] = mapped_column(String(32), default=now)


class Calibration(Base):
    """What a calibration job measured on a cluster's links and GPUs (moetune/workloads/link_probe.py's
    rows); the latest per cluster is what predictions read (estimate/measured.py)."""
    __tablename__ = "calibrations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(200), index=True)
    gpu_type: Mapped[str | None] = mapped_column(String(32), nullable=True)
    record: Mapped[dict] = mapped_column(JSON, default=dict)
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    folder: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[str] = mapped_column(String(32), default=now)


SCHEMA_VERSION = 3


def _migrate_v1(conn) -> None:
    """v0 → v1: the first schema; tables are created by create_all."""


def _migrate_v2(conn) -> None:
    """v1 → v2: the preflights table, created by create_all."""


def _migrate_v3(conn) -> None:
    """v2 → v3: the calibrations table, created by create_all."""


# (version it brings the database to, function of a connection). Append, never edit.
MIGRATIONS: list[tuple[int, Any]] = [(1, _migrate_v1), (2, _migrate_v2), (3, _migrate_v3)]


def database_url(url: str | None = None, read_only: bool = False) -> str:
    url = url or settings.db()
    if "://" not in url:
        if read_only and not Path(url).is_file():
            raise NoStore(f"{url}: no moetune store here; `moetune tune MODEL` or `make demo` makes one")
        if not read_only:
            Path(url).parent.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{Path(url).resolve()}"
    elif read_only:
        _sqlite_file_exists(url)
    return url


def _sqlite_file_exists(url: str) -> None:
    """A read-only open of a SQLite URL: NoStore where its file is not there, since connecting
    would create it (an empty file, in a folder made for it)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # Store names the bad URL in its own line
    database = parsed.database or ""
    if not parsed.drivername.startswith("sqlite") or database in ("", ":memory:") or database.startswith("file:"):
        return
    if not Path(database).is_file():
        raise NoStore(f"{masked(url)}: no moetune store here (no file {database}); `moetune tune MODEL` or "
                      "`make demo` makes one")


# user:password@ of a URL SQLAlchemy cannot parse
_USERINFO = re.compile(r"(?P<head>://[^:/@\s]*:)(?P<password>[^@\s]*)@")


def masked(url: str) -> str:
    """The database URL as any message may show it: its password as ***."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return _USERINFO.sub(lambda m: m["head"] + "***@", url)


def hide_password(text: str, url: str) -> str:
    """`text` (a driver's or SQLAlchemy's message) without the URL's password, as written or decoded."""
    found = {m["password"] for m in _USERINFO.finditer(url)}
    try:
        found.add(make_url(url).password or "")
    except ArgumentError:
        pass
    for password in sorted(filter(None, found), key=len, reverse=True):
        text = text.replace(password, "***")
    return text


# a driver module SQLAlchemy could not import (its URL's dialect+driver) -> what installs it
DRIVERS = {
    "psycopg": "pip install 'moetune[postgres]'",
    "psycopg2": "use postgresql+psycopg:// and pip install 'moetune[postgres]' (or pip install psycopg2-binary)",
    "asyncpg": "use postgresql+psycopg:// and pip install 'moetune[postgres]'",
    "MySQLdb": "pip install mysqlclient (or use mysql+pymysql:// and pip install pymysql)",
    "pymysql": "pip install pymysql",
    "mysql": "pip install mysql-connector-python",
    "mariadb": "pip install mariadb",
}


def _sqlite_pragmas(dbapi_conn, _record, read_only: bool = False) -> None:
    cur = dbapi_conn.cursor()
    if not read_only:  # WAL is written into the file's header
        cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


class Store:
    """All reads and writes of moetune's state. Every write is one transaction."""

    def __init__(self, url: str | None = None, read_only: bool = False):
        """read_only: for commands that only read; nothing is created or migrated (NoStore where
        there is no store, StoreError for a database that is not moetune's)."""
        raw = database_url(url, read_only)
        self.url = masked(raw)  # what every message names: never the password
        try:
            self.engine = create_engine(raw, future=True, **_connect_args(raw))
            if raw.startswith("sqlite"):
                event.listen(self.engine, "connect",
                             lambda c, r: _sqlite_pragmas(c, r, read_only=read_only))
            self.check_schema() if read_only else self.migrate()
        except ArgumentError as e:
            raise StoreError(f"{self.url}: not a database URL ({hide_password(str(e), raw)}); give a "
                             "SQLite path or a SQLAlchemy URL in --db or MOETUNE_DB") from None
        except ModuleNotFoundError as e:
            how = DRIVERS.get((e.name or "").split(".")[0], f"pip install the package of module {e.name}")
            raise StoreError(f"{self.url}: its driver is not installed ({e.name}); {how}") from None
        except DBAPIError as e:
            why = str(e.orig or e).strip().splitlines()[0] if str(e.orig or e).strip() else type(e).__name__
            raise StoreError(f"{self.url}: cannot reach the database ({hide_password(why, raw)}); start "
                             "it or point MOETUNE_DB elsewhere") from None

    # -- schema --------------------------------------------------------------------------
    def schema_version(self) -> int:
        if not inspect(self.engine).has_table("moetune_meta"):
            return 0
        with Session(self.engine) as s:
            row = s.get(Meta, "schema_version")
            return int(row.value) if row else 0

    def check_schema(self) -> None:
        """A read-only open: the database must already be a moetune store of this schema."""
        current = self.schema_version()
        if current == 0:
            tables = sorted(inspect(self.engine).get_table_names())
            raise StoreError(f"{self.url}: not a moetune store" + (f" (its tables: {', '.join(tables[:5])})"
                             if tables else " (no tables)") + "; give moetune's own with --db or MOETUNE_DB")
        # migrations only add tables (MIGRATIONS): an older store reads as it is, without what it lacks
        if current > SCHEMA_VERSION:
            raise StoreError(f"{self.url}: schema version {current} is newer than this moetune "
                             f"({SCHEMA_VERSION}); upgrade moetune")

    def migrate(self) -> None:
        current = self.schema_version()
        if current > SCHEMA_VERSION:
            raise StoreError(f"{self.url}: schema version {current} is newer than this moetune "
                             f"({SCHEMA_VERSION}); upgrade moetune")
        Base.metadata.create_all(self.engine)
        with self.engine.begin() as conn:
            for version, step in MIGRATIONS:
                if version > current:
                    step(conn)
            conn.execute(Meta.__table__.delete().where(Meta.key == "schema_version"))
            conn.execute(Meta.__table__.insert().values(key="schema_version",
                                                        value=str(SCHEMA_VERSION)))

    @contextmanager
    def session(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as s, s.begin():
            yield s

    # -- studies -------------------------------------------------------------------------
    def create_study(self, name: str, model: str, experiment: dict | None = None) -> Study:
        with self.session() as s:
            found = s.scalar(select(Study).where(Study.name == name))
            if found:
                return found
            study = Study(name=name, model=model, experiment=experiment or {})
            s.add(study)
            s.flush()
            return study

    def study(self, name: str) -> Study:
        with self.session() as s:
            found = s.scalar(select(Study).where(Study.name == name))
        if not found:
            raise StoreError(f"no study named {name!r} in {self.url}; run `moetune tune` first")
        return found

    def studies(self) -> list[Study]:
        with self.session() as s:
            return list(s.scalars(select(Study).order_by(Study.id)))

    def set_study_state(self, study_id: int, state: str) -> None:
        with self.session() as s:
            s.get(Study, study_id).state = state

    def set_study_experiment(self, study_id: int, experiment: dict) -> None:
        with self.session() as s:
            s.get(Study, study_id).experiment = json.loads(json.dumps(experiment, default=str))

    # -- trials --------------------------------------------------------------------------
    def add_trial(self, study_id: int, config: dict, config_hash: str,
                  parent_id: int | None = None, fix: str | None = None) -> Trial:
        try:
            with self.session() as s:
                n = s.scalar(select(Trial.number).where(Trial.study_id == study_id)
                             .order_by(Trial.number.desc()).limit(1))
                trial = Trial(study_id=study_id, number=(n or 0) + 1, config=config,
                              config_hash=config_hash, parent_id=parent_id, fix=fix)
                s.add(trial)
                s.flush()
                return trial
        except IntegrityError as e:
            raise DuplicateTrial(f"config {config_hash} already has a trial in study "
                                 f"{study_id}") from e

    def trial(self, trial_id: int) -> Trial:
        with self.session() as s:
            found = s.get(Trial, trial_id)
        if not found:
            raise StoreError(f"no trial {trial_id} in {self.url}; `moetune status` lists them")
        return found

    def trial_by_hash(self, study_id: int, config_hash: str) -> Trial | None:
        with self.session() as s:
            return s.scalar(select(Trial).where(Trial.study_id == study_id,
                                                Trial.config_hash == config_hash))

    def trials(self, study_id: int) -> list[Trial]:
        with self.session() as s:
            return list(s.scalars(select(Trial).where(Trial.study_id == study_id)
                                  .order_by(Trial.number)))

    def update_trial(self, trial_id: int, **values: Any) -> Trial:
        with self.session() as s:
            trial = s.get(Trial, trial_id)
            if trial is None:
                raise StoreError(f"no trial {trial_id} in {self.url}")
            for k, v in values.items():
                if not hasattr(Trial, k):
                    raise StoreError(f"trial has no field {k!r}")
                setattr(trial, k, v)
            return trial

    # -- stages --------------------------------------------------------------------------
    def record_stage(self, trial_id: int, stage: str, inputs_hash: str, outputs: list[str],
                     status: str = "ok", error: str | None = None,
                     started_at: str | None = None) -> StageRun:
        with self.session() as s:
            run = StageRun(trial_id=trial_id, stage=stage, inputs_hash=inputs_hash,
                           outputs=list(outputs), status=status, error=error,
                           started_at=started_at or now(), ended_at=now())
            s.add(run)
            s.flush()
            return run

    def stage_runs(self, trial_id: int, stage: str | None = None) -> list[StageRun]:
        q = select(StageRun).where(StageRun.trial_id == trial_id)
        if stage:
            q = q.where(StageRun.stage == stage)
        with self.session() as s:
            return list(s.scalars(q.order_by(StageRun.id)))

    def last_stage(self, trial_id: int, stage: str) -> StageRun | None:
        runs = [r for r in self.stage_runs(trial_id, stage) if r.status == "ok"]
        return runs[-1] if runs else None

    # -- metrics and decisions -----------------------------------------------------------
    def set_metrics(self, trial_id: int, values: dict[str, float], rank: int | None = None,
                    replace=None) -> None:
        """Replace the trial's scalar metrics (of one rank, or combined when rank is None): all of
        them, or where `replace` names some, only those (the others stay)."""
        with self.session() as s:
            q = Metric.__table__.delete().where(Metric.trial_id == trial_id)
            q = q.where(Metric.rank.is_(None) if rank is None else Metric.rank == rank)
            q = q if replace is None else q.where(Metric.name.in_(list(replace)))
            s.execute(q)
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    s.add(Metric(trial_id=trial_id, name=name, rank=rank, value=float(value)))

    def metrics(self, trial_id: int, rank: int | None = None) -> dict[str, float]:
        q = select(Metric).where(Metric.trial_id == trial_id)
        q = q.where(Metric.rank.is_(None) if rank is None else Metric.rank == rank)
        with self.session() as s:
            return {m.name: m.value for m in s.scalars(q)}

    def add_decision(self, study_id: int, kind: str, reason: str, trial_id: int | None = None,
                     rule: str | None = None, evidence: dict | None = None) -> Decision:
        with self.session() as s:
            d = Decision(study_id=study_id, trial_id=trial_id, kind=kind, rule=rule,
                         reason=reason, evidence=json.loads(json.dumps(evidence or {},
                                                                       default=str)))
            s.add(d)
            s.flush()
            return d

    def decisions(self, study_id: int) -> list[Decision]:
        with self.session() as s:
            return list(s.scalars(select(Decision).where(Decision.study_id == study_id)
                                  .order_by(Decision.id)))

    # -- preflights ----------------------------------------------------------------------
    def add_preflight(self, cluster: str, image: str, fingerprint: str, record: dict,
                      problems: list[dict], job_id: str | None = None,
                      folder: str | None = None) -> Preflight:
        with self.session() as s:
            row = Preflight(cluster=cluster, image=image, fingerprint=fingerprint,
                            record=json.loads(json.dumps(record, default=str)), problems=list(problems),
                            blocking=sum(1 for p in problems if p.get("blocking")), job_id=job_id,
                            folder=folder)
            s.add(row)
            s.flush()
            return row

    def latest_preflight(self, cluster: str, image: str) -> Preflight | None:
        """None where there is none, also in a store older than the table (opened read-only)."""
        if not inspect(self.engine).has_table(Preflight.__tablename__):
            return None
        with self.session() as s:
            return s.scalar(select(Preflight).where(Preflight.cluster == cluster, Preflight.image == image)
                            .order_by(Preflight.id.desc()).limit(1))

    # -- calibrations --------------------------------------------------------------------
    def add_calibration(self, cluster: str, gpu_type: str | None, record: dict, job_id: str | None = None,
                        folder: str | None = None) -> Calibration:
        with self.session() as s:
            row = Calibration(cluster=cluster, gpu_type=gpu_type, record=json.loads(json.dumps(record, default=str)),
                              job_id=job_id, folder=folder)
            s.add(row)
            s.flush()
            return row

    def latest_calibration(self, cluster: str) -> Calibration | None:
        """None where there is none, also in a store older than the table (opened read-only)."""
        if not inspect(self.engine).has_table(Calibration.__tablename__):
            return None
        with self.session() as s:
            return s.scalar(select(Calibration).where(Calibration.cluster == cluster)
                            .order_by(Calibration.id.desc()).limit(1))

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
