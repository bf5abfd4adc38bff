"""The run-directory contract (shared/design.md): the only place training, sweeps and analysis meet.

```
<root>/<sweep>/<run-id>/config.yaml    fully resolved config, written first
                        status.json    state, reason, attempt, job_id, started, ended, warnings (atomic)
                        metrics.jsonl  {"step": int, "<ns>/<name>": float, ...} per line, append-only
                        tokens/        optional parquet token samples
                        checkpoints/   TRL/HF checkpoints (a run restarted here resumes)
                        selected.json  the validation-selected checkpoint (rule, step, rollout, value)
                        report/        per-run report
```
Torch-free; importing it is cheap.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from armorlab.core.config import LOGGING_KEYS
from armorlab.core.fsutil import (
    SMALL_FILE_BYTES,
    NotRegularFile,
    append_line,
    atomic_write_json,
    atomic_write_yaml,
    open_regular,
    read_regular_text,
    yaml_text,
)
from armorlab.errors import ArmorLabError

# libyaml's safe loader when PyYAML was built with it: a report reads hundreds of configs, and
# the pure-Python loader was a fifth of a cold report's parsing time
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

log = logging.getLogger(__name__)

STATES = ("pending", "running", "completed", "failed", "stopped")
# a run in one of these is done: nothing restarts it (``stopped``: it stopped itself, stop_on_collapse)
FINAL_STATES = ("completed", "stopped")
SELECTED = "selected.json"
SELECTED_KEYS = ("rule", "metric", "mode", "step", "rollout", "value", "checkpoint")
CONFIG, STATUS, METRICS, TOKENS, CHECKPOINTS, REPORT = (
    "config.yaml", "status.json", "metrics.jsonl", "tokens", "checkpoints", "report")
# flock'ed by the process training the run for its whole life (the lock dies with it); holds
# that process's pid, host and start as JSON, for messages
OWNER = "owner.lock"
# how long a trainer retries a held lock before concluding another trainer owns the run: a
# reader (status, sweep) probing the lock holds it for microseconds
OWNER_WAIT_S = 5.0
_HELD = (errno.EAGAIN, errno.EACCES)  # flock's "someone else holds it" (EWOULDBLOCK == EAGAIN)
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def canonical_json(cfg: Mapping[str, Any]) -> str:
    """Sorted keys, no whitespace: the byte string the run id is hashed from."""
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def identity(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config without the keys that only change how a run is logged (config.LOGGING_KEYS)."""

    return {k: v for k, v in cfg.items() if k not in LOGGING_KEYS}


def run_id(cfg: Mapping[str, Any]) -> str:
    """First 12 hex digits of sha256(canonical JSON of the fully resolved config), logging
    settings left out; the model and data fingerprints in it make the id follow what is trained."""
    return hashlib.sha256(canonical_json(identity(cfg)).encode("utf-8")).hexdigest()[:12]


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def slurm_job_id(env: Mapping[str, str] | None = None) -> str | None:
    """Slurm's id of the job running this process as status.json records it: ``"123_4"`` for
    array task 4 of job 123, ``"123"`` for a plain job, None outside Slurm."""
    env = os.environ if env is None else env
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


def valid_step(step: Any) -> bool:
    """A logged step: an int (not a bool) that fits the int64 columns readers put it in."""
    return isinstance(step, int) and not isinstance(step, bool) and 0 <= step < 2**63


def _optional_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


class RunDir:
    """One run directory. Writers: the training job. Readers: sweeps, status, analysis."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ---------------------------------------------------------------- paths
    @property
    def id(self) -> str:
        return self.path.name

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG

    @property
    def status_path(self) -> Path:
        return self.path / STATUS

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    @property
    def tokens_dir(self) -> Path:
        return self.path / TOKENS

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def report_dir(self) -> Path:
        return self.path / REPORT

    @property
    def selected_path(self) -> Path:
        return self.path / SELECTED

    # ---------------------------------------------------------------- create
    @classmethod
    def create(cls, root: str | os.PathLike, cfg: Mapping[str, Any], *, durable: bool = True) -> RunDir:
        """Make ``root/<run_id(cfg)>`` with config.yaml (first) and a pending status.

        An existing dir with the same id keeps its files: same config ⇒ same run, to be resumed.
        Its config.yaml takes the new logging settings when only those differ.

        ``durable=False`` is for a sweep's runs that were never submitted, which the sweep's
        manifest makes crash-safe (armorlab.sweeps.manifest): no fsync, a config.yaml or
        status.json that a crash left torn is rewritten, and a dir made just now gets its
        config.yaml written in place and no status.json (a missing status reads as pending,
        and the job writes "running" when it starts): two file-system operations per run
        instead of seven, which is most of what submitting 1,000 runs costs.
        """
        rd = cls(Path(root) / run_id(cfg))
        if not durable:
            try:
                rd.path.mkdir(parents=True)
            except FileExistsError:
                pass
            else:
                with open(rd.config_path, "x", encoding="utf-8") as fh:
                    fh.write(yaml_text(dict(cfg)))
                return rd
        rd.path.mkdir(parents=True, exist_ok=True)
        existing = None
        if rd.config_path.exists():
            try:
                existing = rd.read_config()
            except ArmorLabError:
                if durable:
                    raise
            if existing is not None and run_id(existing) != rd.id:
                if durable:
                    raise ArmorLabError("run directory holds a different config (hash mismatch)",
                                        key="config", value=rd.id, file=str(rd.config_path))
                existing = None  # a torn write that still parses: the name says what it must hold
        if existing != dict(cfg):  # new, torn, or only the logging settings differ
            atomic_write_yaml(rd.config_path, dict(cfg), durable=durable, within=rd.path)
        if not rd.status_path.exists() or (not durable and rd._stored_status() is None):
            rd.write_status("pending", durable=durable)
        return rd

    # ---------------------------------------------------------------- config
    def read_config(self) -> dict[str, Any]:
        try:
            data = yaml.load(read_regular_text(self.config_path), Loader=_SAFE_LOADER)
        except OSError as exc:
            raise ArmorLabError(f"cannot read run config: {exc.strerror or exc}", file=str(self.config_path)) \
                from None
        except RecursionError:
            raise ArmorLabError("run config is nested too deeply to be a config", file=str(self.config_path)) \
                from None
        except UnicodeDecodeError as exc:
            raise ArmorLabError(f"run config is not UTF-8 text ({exc.reason})", file=str(self.config_path)) \
                from None
        except yaml.YAMLError as exc:
            raise ArmorLabError(f"invalid YAML: {exc}", file=str(self.config_path)) from None
        if not isinstance(data, dict):
            raise ArmorLabError("run config must be a mapping", file=str(self.config_path))
        return data

    # ---------------------------------------------------------------- status
    def _stored_status(self) -> dict[str, Any] | None:
        """status.json as stored when it is a readable status, else None (no warning)."""
        try:
            data = json.loads(read_regular_text(self.status_path))
        except (OSError, ValueError, RecursionError):
            return None
        return data if isinstance(data, dict) and data.get("state") in STATES else None

    def read_status(self) -> dict[str, Any]:
        """The status dict, or a synthetic pending one when the file is missing or unreadable.
        A damaged field (``"attempt": "x"``, a non-string reason) is replaced by its empty value
        with a warning naming the file, so readers can trust the types."""
        empty = {"state": "pending", "reason": None, "attempt": 0, "job_id": None,
                 "started": None, "ended": None}
        try:
            data = json.loads(read_regular_text(self.status_path))
        except FileNotFoundError:
            return empty
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            log.warning("ignoring unreadable %s: %s", self.status_path, exc)
            return empty
        except RecursionError:  # json's C parser recurses per nesting level
            log.warning("ignoring %s: nested too deeply to be a status", self.status_path)
            return empty
        if not isinstance(data, dict) or data.get("state") not in STATES:
            log.warning("ignoring %s: no valid state", self.status_path)
            return empty
        for key, ok in (("attempt", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
                        ("reason", _optional_str), ("job_id", _optional_str), ("started", _optional_str),
                        ("ended", _optional_str)):
            if key in data and not ok(data[key]):
                log.warning("ignoring damaged field %r = %.60r in %s", key, data[key], self.status_path)
                data[key] = empty[key]
        warnings = data.get("warnings")
        if warnings is not None and not (isinstance(warnings, list) and all(isinstance(w, str) for w in warnings)):
            log.warning("ignoring damaged field 'warnings' = %.60r in %s", warnings, self.status_path)
            del data["warnings"]
        return data

    def write_status(self, state: str, *, reason: str | None = None, job_id: str | None = None,
                     attempt: int | None = None, durable: bool = True,
                     world_size: int | None = None) -> dict[str, Any]:
        """Atomically replace status.json. ``running`` bumps the attempt and stamps ``started``;
        ``completed``/``failed``/``stopped`` stamp ``ended``; ``world_size`` (training processes of the
        attempt) is kept until an attempt records another."""
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        old = self.read_status() if self.status_path.exists() else None
        prev_attempt = old["attempt"] if old else 0
        status = {
            "state": state,
            "reason": reason,
            "attempt": attempt if attempt is not None else prev_attempt + (state == "running"),
            "job_id": job_id if job_id is not None else (old or {}).get("job_id"),
            "started": now_iso() if state == "running" else (old or {}).get("started"),
            "ended": now_iso() if state in ("completed", "failed", "stopped") else None,
        }
        if (old or {}).get("warnings"):
            status["warnings"] = old["warnings"]
        world_size = world_size if world_size is not None else (old or {}).get("world_size")
        if world_size is not None:
            status["world_size"] = int(world_size)
        try:
            atomic_write_json(self.status_path, status, durable=durable, within=self.path)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self.status_path.is_file():
                raise
            # a full disk: no room for the temp file of an atomic write. status.json exists (it
            # said "running"); rewriting it in place reuses its block, so "failed: no space left"
            # still gets recorded (a reader may, for an instant, see it torn: it reads as pending)
            _rewrite_in_place(self.status_path, json.dumps(status, indent=2, sort_keys=True) + "\n")
        return status

    def set_warnings(self, warnings: list[str]) -> None:
        """Replace the status' ``warnings`` (armorlab.core.health: runs that train on nothing)."""
        status = self.read_status()
        if status.get("warnings", []) == warnings:
            return
        status["warnings"] = list(warnings)
        atomic_write_json(self.status_path, status, within=self.path)

    # ---------------------------------------------------------------- metrics
    def append_metrics(self, step: int, metrics: Mapping[str, float], *, rollout: int | None = None) -> None:
        """Append one line ``{"step": step, "rollout": rollout, **metrics}`` (the rollout counter when
        given); non-finite floats become null."""
        row: dict[str, Any] = {"step": int(step)}
        if rollout is not None:
            row["rollout"] = int(rollout)
        for key, value in metrics.items():
            value = float(value)
            row[key] = value if math.isfinite(value) else None
        append_line(self.metrics_path, json.dumps(row, separators=(",", ":")), within=self.path)

    def iter_metrics(self) -> Iterator[dict[str, Any]]:
        """Yield the parsed lines in file order; a torn (unparseable) line, or one whose step is not
        an integer in [0, 2^63), is skipped with a warning; an unreadable file yields nothing."""
        try:
            fh = open(open_regular(self.metrics_path), encoding="utf-8", errors="replace")  # noqa: SIM115
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("cannot read %s: %s", self.metrics_path, exc)
            return
        with fh:
            try:
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except (ValueError, RecursionError):  # torn, or nested past json's recursion limit
                        log.warning("skipping torn line %d of %s", lineno, self.metrics_path)
                        continue
                    if isinstance(row, dict) and valid_step(row.get("step")):
                        yield row
            except OSError as exc:  # e.g. a directory named metrics.jsonl
                log.warning("cannot read %s: %s", self.metrics_path, exc)

    def read_metrics(self) -> list[dict[str, Any]]:
        """One merged row per step, sorted by step; after a resume the later line wins per key."""
        by_step: dict[int, dict[str, Any]] = {}
        for row in self.iter_metrics():
            by_step.setdefault(row["step"], {}).update(row)
        return [by_step[s] for s in sorted(by_step)]

    def last_step(self) -> int | None:
        steps = [row["step"] for row in self.iter_metrics()]
        return max(steps) if steps else None

    # ---------------------------------------------------------------- ownership
    @property
    def owner_path(self) -> Path:
        return self.path / OWNER

    def acquire_owner(self, *, wait_s: float = OWNER_WAIT_S) -> int | None:
        """Take the run dir's exclusive lock for this process; returns its fd (keep it open while
        training; closing it or exiting releases the lock), or None when another live process
        holds it. Only one process may train a run dir at a time.

        The lock file is opened without following a symlink and must be a regular file: a link
        planted there would otherwise have the owner record written into whatever it points to,
        and a FIFO would block. Anything else there is an ArmorLabError (exit 2)."""
        fd = self._open_owner(os.O_RDWR | os.O_CREAT)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in _HELD or time.monotonic() >= deadline:
                    os.close(fd)
                    if exc.errno in _HELD:
                        return None
                    raise
            time.sleep(0.05)
        import socket  # here: start-up of `status` and `sweep --dry-run` (issue 14)

        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": now_iso(), "job_id": slurm_job_id()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        return fd

    def _open_owner(self, flags: int) -> int:
        try:
            return open_regular(self.owner_path, flags, 0o666, follow_symlinks=False)
        except (NotRegularFile, IsADirectoryError) as exc:
            what = str(exc) if isinstance(exc, NotRegularFile) else "a directory, not a regular file"
            raise ArmorLabError(f"the run dir's lock file is {what}: remove it (armorlab creates it)",
                                key=OWNER, value=None, file=str(self.owner_path)) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
                raise ArmorLabError("the run dir's lock file is a symlink: remove it (armorlab never follows "
                                    "one there)", key=OWNER, value=os.readlink(self.owner_path),
                                    file=str(self.owner_path)) from None
            raise

    def owner(self) -> dict[str, Any] | None:
        """The live process training this run (its pid, host, since), or None when no process holds
        the run dir's lock: a run whose status says running without an owner is dead. A lock file
        that is no regular file (see acquire_owner) has no owner; it is never opened to block."""
        try:
            fd = self._open_owner(os.O_RDONLY)
        except (OSError, ArmorLabError):
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in _HELD:
                    return None  # no flock here (some network file systems): cannot tell
                try:
                    info = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")
                except ValueError:
                    info = {}
                return info if isinstance(info, dict) else {}
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    # ---------------------------------------------------------------- checkpoints
    def checkpoints(self) -> list[Path]:
        if not self.checkpoints_dir.is_dir():
            return []
        found = []
        for p in self.checkpoints_dir.iterdir():
            m = _CHECKPOINT_RE.match(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
        return [p for _, p in sorted(found)]

    def last_checkpoint(self) -> Path | None:
        cps = self.checkpoints()
        return cps[-1] if cps else None

    def read_selected(self) -> dict[str, Any] | None:
        """selected.json (the run's validation-selected checkpoint, written by the trainer), or None
        when the run has none yet; a damaged file is an ArmorLabError naming it."""
        try:
            data = json.loads(read_regular_text(self.selected_path, limit=SMALL_FILE_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ArmorLabError(f"cannot read the selected checkpoint: {exc}", file=str(self.selected_path)) from None
        missing = [k for k in SELECTED_KEYS if not isinstance(data, dict) or k not in data]
        if missing:
            raise ArmorLabError(f"not a selected.json: {', '.join(missing)} missing", key=missing[0],
                                file=str(self.selected_path))
        return data


def _rewrite_in_place(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        data = text.encode("utf-8")
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def expand_globs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The paths as given, each glob pattern replaced by its matches (sorted); a pattern that
    matches nothing is an ArmorLabError naming it (a typo must not shrink a report silently). A
    path that exists as written is literal, magic characters or not (``runs/exp[1]`` is that dir,
    not ``runs/exp1``)."""
    import glob  # here: most commands name no glob

    out: list[Path] = []
    for p in paths:
        text = str(p)
        if glob.has_magic(text) and not os.path.lexists(text):
            matches = sorted(glob.glob(text))
            if not matches:
                raise ArmorLabError("glob matches nothing", key="runs", value=text)
            out.extend(Path(m) for m in matches)
        else:
            out.append(Path(text))
    return out


def find_run_dirs(paths: Iterable[str | os.PathLike]) -> list[RunDir]:
    """Run dirs named directly or found below the given paths (a sweep dir, a root of sweeps)."""
    seen: dict[Path, RunDir] = {}
    for p in paths:
        p = Path(p)
        if (p / CONFIG).is_file():
            seen.setdefault(p.resolve(), RunDir(p))
            continue
        if not p.is_dir():
            raise ArmorLabError("not a run or sweep directory", key="path", value=str(p))
        # a sweep dir holds run dirs; a root holds sweep dirs. Not rglob: checkpoints are deep.
        for cfg in sorted([*p.glob(f"*/{CONFIG}"), *p.glob(f"*/*/{CONFIG}")]):
            if cfg.parent.name.startswith("."):
                continue
            seen.setdefault(cfg.parent.resolve(), RunDir(cfg.parent))
    return list(seen.values())
