"""Optuna backend of a study whose trials are runs: storage, sampler, study, reconciliation.

Imports optuna at module import: only the tune worker, ``armorlab tune`` and study reports load
this module, never ``armorlab --help``.

Storage. The default is a journal file in the study dir (``.tune/journal.log``) guarded by
``JournalFileOpenLock`` (an O_EXCL lock file, safe across processes on one host and on NFSv3+).
A database URL gives ``RetryingRDBStorage`` (RDBStorage whose calls ride out a server restart)
with heartbeats: a trial whose worker stops beating is failed by Optuna and re-queued by
``RequeueStaleTrial`` (armorlab's requeue, so retries count alike). The journal has no heartbeat, so
``reconcile`` does that job: every worker records who runs a trial (host, pid, process start
time, Slurm job) in the trial's user attrs, and a RUNNING trial whose owner is provably dead is
failed and its params re-enqueued. Owners that cannot be checked from here (another host, no
Slurm) are left alone: failing a live worker's trial would run the same point twice.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage
from optuna.trial import FrozenTrial, TrialState

from armorlab.core.runs import slurm_job_id
from armorlab.errors import ArmorLabError
from armorlab.sweeps import slurmctl
from armorlab.tune.pruners import make_pruner
from armorlab.tune.secrets import recall, redact, scrub, split_password
from armorlab.tune.space import HEARTBEAT_DEFAULT, SearchSpec

log = logging.getLogger(__name__)

TUNE_DIR = ".tune"
JOURNAL = "journal.log"
HEARTBEAT_INTERVAL_S = HEARTBEAT_DEFAULT["interval"]  # search.heartbeat overrides both
HEARTBEAT_GRACE_S = HEARTBEAT_DEFAULT["grace"]
# The journal's stand-in for heartbeats, used only for owners reconcile cannot check directly
# (another host, no Slurm): the worker touches .tune/beats/<trial> every BEAT_INTERVAL_S; a trial
# whose beat file is older than BEAT_GRACE_S is taken for dead.
BEATS = "beats"
BEAT_INTERVAL_S = 30
BEAT_GRACE_S = 600
# File systems on which journal files and SQLite are known to corrupt or dead-lock (no reliable
# POSIX locks / rename atomicity across clients).
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "afs", "9p", "fuse.glusterfs"})


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Silence Optuna's notes on APIs we use on purpose: heartbeats and the stale-trial retry are
    "experimental", and heartbeats outside ``study.optimize`` (we run ask/tell) draw a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        yield


# --------------------------------------------------------------------------- storage
def fs_type(path: str | os.PathLike, mounts: str = "/proc/mounts") -> str | None:
    """File-system type of the mount holding ``path`` (longest mount-point prefix), or None."""
    target = os.path.realpath(path)
    best, best_type = "", None
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mnt = parts[1].replace("\\040", " ")
        inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, best_type = mnt, parts[2]
    return best_type


_warned: set[str] = set()


def warn_if_network_fs(path: str | os.PathLike, what: str, mounts: str = "/proc/mounts") -> str | None:
    """Log a warning (once per path and process) and return it when ``path`` is on a network FS."""
    kind = fs_type(path, mounts)
    if kind in NETWORK_FS:
        msg = (f"{what} {path} is on a network file system ({kind}): journal files and SQLite "
               "databases on NFS are known to corrupt or lock up; use --storage postgresql://... "
               "for a cluster")
        if msg not in _warned:
            _warned.add(msg)
            log.warning(msg)
        return msg
    return None


# SQLAlchemy dialect → (driver modules it can use, in order of preference; the extra that installs one)
DB_DRIVERS: dict[str, tuple[tuple[str, ...], str]] = {
    "postgresql": (("psycopg", "psycopg2"), "pip install 'armorlab[postgres]'"),
    "mysql": (("pymysql", "MySQLdb"), "pip install pymysql"),
}
DB_RETRY_ENV = "ARMORLAB_DB_RETRY_S"
DB_RETRY_S = 600.0  # how long a worker keeps retrying an unreachable database before it stops
CONNECT_RETRY_S = 30.0  # the same for the first connection of a process


def rdb_url(url: str) -> str:
    """The SQLAlchemy URL to connect with: ``$VARS`` expanded and the driver named (``with_driver``)."""
    return with_driver(os.path.expandvars(url), shown=url)


def with_driver(url: str, *, shown: str | None = None) -> str:
    """``url`` with its database driver named when it names none: ``postgresql://`` means
    psycopg2 to SQLAlchemy 2.0 and psycopg 3 to 2.1, so say which one is installed (armorlab's
    ``postgres`` extra installs psycopg 3). A missing driver is an ArmorLabError naming the
    extra to install, raised before any worker starts. ``$VARS`` are left as they are."""
    import importlib.util

    scheme, sep, rest = url.partition("://")
    dialect, _, driver = scheme.partition("+")
    if dialect == "postgres":  # libpq's spelling; SQLAlchemy only knows postgresql
        dialect = "postgresql"
    if dialect not in DB_DRIVERS:
        return url
    modules, install = DB_DRIVERS[dialect]
    wanted = (driver,) if driver else modules
    found = next((m for m in wanted if importlib.util.find_spec(m) is not None), None)
    if found is None:
        raise ArmorLabError(f"a {dialect} storage needs a database driver ({' or '.join(wanted)}), and none "
                            f"is installed: {install}", key="--storage", value=redact(shown or url))
    return f"{dialect}+{driver or found}{sep}{rest}"


# what a server says when it refuses the credentials (libpq, MySQL): not a lost connection, and
# retrying it for minutes would only hide it behind "unreachable"
_AUTH_FAILED = ("authentication failed", "no password supplied", "password authentication",
                "access denied for user", "fe_sendauth")


def auth_failed(exc: BaseException) -> bool:
    return any(a in str(e).lower() for e in (exc, exc.__cause__) if e is not None for a in _AUTH_FAILED)


def _connection_lost(exc: BaseException) -> bool:
    """Is ``exc`` (or what it wraps) the database being unreachable, rather than a bad query?"""
    import sqlalchemy.exc as sa_exc

    if auth_failed(exc):
        return False
    for e in (exc, exc.__cause__):
        if isinstance(e, sa_exc.DBAPIError) and e.connection_invalidated:
            return True
        if isinstance(e, (sa_exc.OperationalError, sa_exc.InterfaceError)):
            return True
    return False


class DatabaseUnavailable(Exception):
    """The study's database stayed unreachable for longer than the retry budget. Not an
    ArmorLabError (a ValueError): code that reads a ValueError as a bad trial must not swallow it."""


class _RetryState(threading.local):
    depth = 0


def _with_retry(fn: Callable[..., Any], what: str, cap_s: float | None = None) -> Callable[..., Any]:
    """``fn`` retried with exponential back-off (0.5 s doubling to 30 s) while the database is
    unreachable, for ``ARMORLAB_DB_RETRY_S`` seconds at most (default DB_RETRY_S); only the
    outermost storage call retries (RDBStorage methods call one another)."""

    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = self._retry_state
        if state.depth:
            return fn(self, *args, **kwargs)
        budget = float(os.environ.get(DB_RETRY_ENV, DB_RETRY_S))
        if cap_s is not None:
            budget = min(budget, cap_s)
        t0, delay = time.monotonic(), 0.5
        while True:
            state.depth += 1
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                if not _connection_lost(exc):
                    raise
                waited = time.monotonic() - t0
                if waited + delay > budget:
                    raise DatabaseUnavailable(
                        f"the study database {redact(self.url)} was unreachable for {waited:.0f}s "
                        f"({what}; {DB_RETRY_ENV}={budget:g}); last error: "
                        f"{scrub(str(exc.__cause__ or exc), self.url).strip().splitlines()[0]}") from None
                log.warning("database unreachable (%s): retrying in %.1fs", what, delay)
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
            finally:
                state.depth -= 1

    return call


class RetryingRDBStorage(RDBStorage):
    """RDBStorage whose calls survive a database restart: every public method retries while the
    server is unreachable (see ``_with_retry``); ``pool_pre_ping`` replaces the dead pooled
    connections. A call the server committed but whose answer was lost may run twice; the only
    harmful case, a duplicate ``create_new_trial``, leaves an unclaimed RUNNING trial, which
    ``reconcile`` fails."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        self._retry_state = _RetryState()
        self.url = url
        # a short budget for the first connection: a wrong URL must not hang the CLI for minutes
        _with_retry(RDBStorage.__init__, "connect", cap_s=CONNECT_RETRY_S)(self, url, **kwargs)


for _name, _fn in list(vars(RDBStorage).items()):
    if inspect.isfunction(_fn) and not _name.startswith("__") and _name not in ("get_heartbeat_interval",
                                                                        "get_heartbeat_stale_trial_callback"):
        setattr(RetryingRDBStorage, _name, _with_retry(_fn, _name.lstrip("_")))


class RequeueStaleTrial:
    """Optuna's heartbeat-stale callback, done the armorlab way: the trial Optuna just failed is
    re-enqueued with the same params and ``retries`` + 1 (up to ``max_retries``), so a retry is
    counted alike whether the heartbeat or ``reconcile`` found the dead worker, and preemptions
    (``fail_and_requeue(count_retry=False)``) stay uncounted."""

    def __init__(self, max_retries: int, grace_s: int) -> None:
        self.max_retries, self.grace_s = max_retries, grace_s

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        owner = trial.user_attrs.get("worker") or {}
        reason = (f"no heartbeat for over {self.grace_s}s (worker on {owner.get('host')} pid "
                  f"{owner.get('pid')} job {owner.get('job')} died or lost the database)")
        requeue(study, trial, reason, self.max_retries, record_reason=True)


def open_storage(study_dir: Path, url: str | None, *, max_retries: int = 2,
                 heartbeat_interval: int = HEARTBEAT_INTERVAL_S,
                 grace_period: int = HEARTBEAT_GRACE_S) -> optuna.storages.BaseStorage:
    """Journal file in ``study_dir/.tune`` when ``url`` is None, else an RDB with heartbeats.

    ``$VARS`` in the URL are expanded here, so a password can stay in the environment rather
    than in the spec or in ``.tune/study.json``.
    """
    if url is None:
        tune_dir = Path(study_dir) / TUNE_DIR
        tune_dir.mkdir(parents=True, exist_ok=True)
        path = str(tune_dir / JOURNAL)
        warn_if_network_fs(tune_dir, "the study journal")
        return JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
    expanded, password = split_password(rdb_url(url))  # the driver gets the password, no URL holds it
    password = password if password is not None else recall(url)
    if expanded.startswith("sqlite:///"):
        db = expanded[len("sqlite:///"):]
        if db and db != ":memory:":
            warn_if_network_fs(Path(db).parent if Path(db).parent.exists() else ".", "the SQLite database")
    engine_kwargs: dict[str, Any] = {}
    if not expanded.startswith("sqlite"):
        # test pooled connections before use: after a server restart they are all dead
        engine_kwargs["pool_pre_ping"] = True
        if expanded.startswith("postgresql+psycopg"):
            engine_kwargs["connect_args"] = {"connect_timeout": 10}
        if password is not None:
            engine_kwargs.setdefault("connect_args", {})["password"] = password
    try:
        with quiet_optuna():
            return RetryingRDBStorage(expanded, engine_kwargs=engine_kwargs,
                                      heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                                      heartbeat_stale_trial_callback=RequeueStaleTrial(max_retries, grace_period))
    except ArmorLabError:
        raise
    except (ImportError, ModuleNotFoundError) as exc:
        raise ArmorLabError(f"storage needs a database driver: {exc}", key="--storage", value=redact(url)) from None
    except Exception as exc:  # sqlalchemy raises its own types for bad URLs or unreachable hosts
        why = scrub(str(exc.__cause__ or exc), url, rdb_url(url)).strip().splitlines()
        if auth_failed(exc):
            raise ArmorLabError(f"authentication failed for the study database ({why[0] if why else exc}): "
                                "armorlab never stores a password; give it as PGPASSWORD or in ~/.pgpass "
                                "(or $VAR in the URL)", key="--storage", value=redact(url)) from None
        if isinstance(exc, DatabaseUnavailable):
            raise ArmorLabError(f"cannot open storage: {scrub(str(exc), url, rdb_url(url))}", key="--storage",
                                value=redact(url)) from None
        raise ArmorLabError(f"cannot open storage: {why[0] if why else type(exc).__name__}", key="--storage",
                            value=redact(url)) from None


def storage_options(search: SearchSpec) -> dict[str, int]:
    """``open_storage`` keywords from the spec: retries and the heartbeat."""
    return {"max_retries": search.max_retries, "heartbeat_interval": search.heartbeat_interval,
            "grace_period": search.heartbeat_grace}


def storage_has_heartbeat(storage: Any) -> bool:
    getter = getattr(storage, "get_heartbeat_interval", None)
    return bool(getter and getter())


@contextlib.contextmanager
def study_lock(study_dir: Path) -> Iterator[None]:
    """Serialise count → ask and reconciliation across workers (same lock type as the journal)."""
    tune_dir = Path(study_dir) / TUNE_DIR
    tune_dir.mkdir(parents=True, exist_ok=True)
    lock = JournalFileOpenLock(str(tune_dir / "study"))
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


# --------------------------------------------------------------------------- sampler
def make_sampler(search: SearchSpec, seed: int | None) -> optuna.samplers.BaseSampler:
    """The spec's sampler with ``seed`` (the caller derives a per-worker seed)."""
    opts = {k: v for k, v in search.sampler.items() if k not in ("type", "seed")}
    kind = search.sampler["type"]
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **opts)
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed, **opts)
    if kind == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise ArmorLabError("the cmaes sampler needs the `cmaes` package (pip install cmaes)",
                                key="search.sampler.type", value=kind, file=search.file) from None
        return optuna.samplers.CmaEsSampler(seed=seed, **opts)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        return _GridSampler(search.grid(), seed=seed)
    if kind == "bruteforce":
        with quiet_optuna():  # "experimental" since Optuna 3.1
            return optuna.samplers.BruteForceSampler(seed=seed)
    raise AssertionError(kind)  # parse_search rejects other types


class _GridSampler(optuna.samplers.GridSampler):
    """GridSampler whose ``after_trial`` does not call ``study.stop()``: that only works inside
    ``study.optimize``, and our workers stop on their own count of finished trials."""

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Any) -> None:
        return None


def open_study(study_dir: Path, name: str, search: SearchSpec, storage: optuna.storages.BaseStorage, *,
               base_cfg: Mapping[str, Any], seed: int | None = None) -> optuna.Study:
    """Create or load (resume) the study named after the spec; directions must match."""
    sampler = make_sampler(search, seed)
    pruner = make_pruner(search, base_cfg)
    try:
        existing = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    except KeyError:
        existing = None
    if existing is not None:
        have = tuple(d.name.lower() for d in existing.directions)
        if have != search.directions:
            raise ArmorLabError(f"study '{name}' in this storage was created with directions {list(have)}; "
                                "start a new study (rename it) to change the objective",
                                key="search.direction", value=list(search.directions), file=search.file)
        return existing
    return optuna.create_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner,
                               directions=list(search.directions), load_if_exists=True)


# --------------------------------------------------------------------------- worker identity
def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (guards against pid reuse), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])  # field 22 overall
    except (IndexError, ValueError):
        return None


def worker_identity(index: int = 0) -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": process_start_time(pid),
            "job": slurm_job_id(), "index": index}


def slurm_job_alive(job: str) -> bool | None:
    """True/False from squeue (the sweep layer's view of live jobs); None when Slurm cannot answer."""
    try:
        states = slurmctl.squeue_states([job])
    except slurmctl.SlurmUnavailable:
        return None
    return slurmctl.is_active(states.get(job))


def owner_alive(owner: Mapping[str, Any] | None, me: Mapping[str, Any]) -> bool | None:
    """Is the worker described by ``owner`` still running? None when it cannot be told from here."""
    if not owner:
        # ask and the owner attribute are written under the study lock, so a RUNNING trial
        # without an owner was left by a worker that died in between.
        return False
    same_proc = (owner.get("host"), owner.get("pid"), owner.get("start")) == \
        (me.get("host"), me.get("pid"), me.get("start"))
    if same_proc:
        return True
    job = owner.get("job")
    if job:
        if job == me.get("job"):
            return False  # our own Slurm job, an earlier (requeued) incarnation
        return slurm_job_alive(job)
    if owner.get("host") != me.get("host"):
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    start = process_start_time(pid)
    return start is not None and start == owner.get("start")


def retry_count(trial: FrozenTrial) -> int:
    return int(trial.user_attrs.get("retries", 0))


def fail_and_requeue(study: optuna.Study, trial: FrozenTrial, reason: str, max_retries: int, *,
                     count_retry: bool = True) -> bool:
    """Mark a RUNNING trial FAIL and enqueue its params again (within max_retries).

    Returns True when it was re-enqueued. Call under ``study_lock``.
    """
    storage = study._storage  # no public setter for another process's trial
    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
        storage.set_trial_user_attr(trial._trial_id, "fail_reason", reason)
    try:
        study.tell(trial.number, state=TrialState.FAIL)
    except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
        return False  # someone else finished it meanwhile
    return requeue(study, trial, reason, max_retries, count_retry=count_retry)


def requeue(study: optuna.Study, trial: FrozenTrial, reason: str, max_retries: int, *,
            count_retry: bool = True, record_reason: bool = False) -> bool:
    """Enqueue the params of a trial that just FAILed again, unless it used up ``max_retries``.
    ``record_reason``: keep ``reason`` on the retry (``retry_reason``), for a failed trial that
    could not take a ``fail_reason`` any more (Optuna's heartbeat finished it)."""
    retries = retry_count(trial) + (1 if count_retry else 0)
    if retries > max_retries:
        log.warning("trial %d failed (%s); not retried: max_retries=%d reached", trial.number, reason,
                    max_retries)
        return False
    origin = trial.user_attrs.get("retry_of", trial.number)
    attrs = {"retry_of": origin, "retries": retries, **({"retry_reason": reason} if record_reason else {})}
    study.enqueue_trial(dict(trial.params), user_attrs=attrs)
    log.warning("trial %d failed (%s); its params are queued again", trial.number, reason)
    return True


def beat_path(study_dir: Path, number: int) -> Path:
    return Path(study_dir) / TUNE_DIR / BEATS / str(number)


def touch_beat(study_dir: Path, number: int) -> None:
    path = beat_path(study_dir, number)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def beat_age_s(study_dir: Path, trial: FrozenTrial) -> float | None:
    """Seconds since the trial's worker last touched its beat file (or since the trial started)."""
    import time

    try:
        last = beat_path(study_dir, trial.number).stat().st_mtime
    except OSError:
        if trial.datetime_start is None:
            return None
        last = trial.datetime_start.timestamp()
    return time.time() - last


def reconcile(study: optuna.Study, me: Mapping[str, Any], max_retries: int, *,
              study_dir: Path | None = None, beat_grace_s: float = BEAT_GRACE_S) -> list[int]:
    """Fail and re-enqueue RUNNING trials whose worker is dead. Call under ``study_lock``.

    With an RDB storage, Optuna's heartbeat does this (and would double-enqueue if we did it too).
    With the journal, owners that cannot be checked from here fall back to the beat files in
    ``study_dir`` (when given).
    """
    if storage_has_heartbeat(study._storage):
        with quiet_optuna():
            optuna.storages.fail_stale_trials(study)
        # Optuna judges only trials that have beaten once; a claimed trial beats at once (under
        # this lock), so an unclaimed RUNNING one is a create_new_trial replayed after a lost answer
        orphans = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if "worker" not in t.user_attrs]
        for trial in orphans:
            fail_and_requeue(study, trial, "never claimed by a worker", max_retries, count_retry=False)
        return [t.number for t in orphans]
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get("worker")
        alive = owner_alive(owner, me)
        if alive is False:
            where = f"{owner.get('host')} pid {owner.get('pid')}" if owner else "unknown"
            fail_and_requeue(study, trial, f"worker died ({where})", max_retries)
            failed.append(trial.number)
        elif alive is None:
            age = beat_age_s(study_dir, trial) if study_dir is not None else None
            if age is not None and age > beat_grace_s:
                fail_and_requeue(study, trial, f"worker on {owner.get('host')} silent for {age:.0f}s",
                                 max_retries)
                failed.append(trial.number)
            else:
                log.info("trial %d runs on %s (pid %s): cannot check that worker from here", trial.number,
                         owner.get("host"), owner.get("pid"))
    return failed


def state_counts(study: optuna.Study) -> dict[str, int]:
    counts = {s.name.lower(): 0 for s in TrialState}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name.lower()] += 1
    counts["finished"] = counts["complete"] + counts["pruned"]
    return counts
