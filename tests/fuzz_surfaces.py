"""The malformed-input campaign's named cases over the surfaces added since issue 13's generated ones
(issue 30): security (owner.lock, storage passwords, start-up hooks in a profile, NUL bytes), data
and model inputs, damaged run dirs and caches, TRL's vLLM fields and named choices, values that used
to fail only when a job started, paths, and what a new user tripped on. Shared by tests/test_fuzz.py
(a sample) and benchmarks/fuzz.py (all of them).

Every case runs the ``armorlab`` CLI in a child process (a hang is a timeout, a crash a signal: an
in-process run could not survive either) with the armorlab of ``tree`` on PYTHONPATH, so the same
cases measure any checkout (``benchmarks/fuzz.py --tree /path/to/main`` is the "before" figure).
An outcome is one of:

- ``ok`` / ``error``: exit 0 / exit 2 without a traceback, as expected;
- ``traceback``: any other exit code, or "Traceback" on stderr; ``segfault``: killed by a signal
  (pyarrow's segfault);
- ``hang``: still running at the case's timeout (then killed);
- ``payload``: something the input smuggled in ran (a marker file written); ``writes_outside``: a
  file or dir a planted symlink points to was changed; ``secrets``: a password in the output or in
  a file written (a case's ``harm`` says which of the three its ``payload`` check measures);
- ``accepted``: exit 0 where the input is invalid (the old "accepted-but-invalid");
- ``refused``: exit 2 where the input is valid;
- ``unnamed``: the expected exit 2, but the message lacks what the case says it must name (the
  key, the value, the file, or the words of the fix);
- ``wrong``: exit 0 with results other than the truth (a damaged cache read as other values).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

OUTCOMES = ("ok", "error", "traceback", "segfault", "hang", "payload", "writes_outside", "secrets", "accepted",
            "refused", "unnamed", "wrong")
BAD = ("traceback", "segfault", "hang", "payload", "writes_outside", "secrets", "accepted", "refused", "unnamed",
       "wrong")


@dataclass
class Case:
    surface: str
    name: str
    build: Callable[[Workspace, Path], list[str]]   # writes the case's files, returns the CLI's argv
    expect: str = "error"                            # "error" | "ok"
    names: tuple[str, ...] = ()                      # what stdout+stderr must contain (error or ok)
    timeout: float = 60.0
    env: dict[str, str] = field(default_factory=dict)
    payload: Callable[[Workspace, Path, str], bool] | None = None  # (ws, case dir, output) → ran/leaked
    check: Callable[[Workspace, Path], bool] | None = None        # an exit 0's results are right
    slow: bool = False                               # trains, loads a model or waits on a service
    needs: str | None = None                         # "mount", "postgres", "slurm": skipped without
    harm: str = "payload"                            # what a payload is: payload | writes_outside | secrets


@dataclass
class Result:
    case: Case
    outcome: str
    rc: int | None
    seconds: float
    tail: str


# --------------------------------------------------------------------------- the workspace
class Workspace:
    """A temp dir with what cases copy and damage: a loadable (untrained) tiny HF model, a small
    math data set, a healthy sweep of three runs with different curves, and a spare dir."""

    def __init__(self, tree: str | os.PathLike = REPO, python: str = sys.executable) -> None:
        self.tree, self.python = str(tree), python
        self.root = Path(tempfile.mkdtemp(prefix="armorlab-surfaces-"))
        self.n = 0
        self.model = self.root / "model"
        self.data = self.root / "data.jsonl"
        self.sweep = self.root / "healthy" / "sw"
        self.cache = self.root / "cache"  # empty: nothing is ever built into it silently
        self.data.write_text("".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                                     for i in range(40)))
        setup = f"""
import json, sys
from armorlab.core.config import resolve
from armorlab.core.runs import RunDir
from armorlab.train.models import build_model, build_tokenizer
tok = build_tokenizer()
m = build_model({{"hidden_size": 64, "num_layers": 1, "num_heads": 2, "warm_start_seed": 0}}, tok)
m.save_pretrained({str(self.model)!r}); tok.save_pretrained({str(self.model)!r})
cfg = resolve({{"max_steps": 20, "val_every": 10}})
for seed, top in ((0, 0.5), (1, 0.9), (2, 0.2)):
    rd = RunDir.create({str(self.sweep)!r}, {{**cfg, "seed": seed}})
    for step in (0, 10, 20):
        rd.append_metrics(step, {{"val/acc": top * (1 + step / 20) / 2, "test/acc": top, "train/reward": step / 20}})
    rd.write_status("completed")
"""
        subprocess.run([python, "-c", setup], check=True, env=self.env({"PYTHONPATH": str(REPO)}),
                       capture_output=True, timeout=600)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": self.tree, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg", "ARMORLAB_CACHE": str(self.cache),
               "COLUMNS": "160", "ARMORLAB_DB_RETRY_S": "2"}
        env.pop("PGPASSWORD", None)
        return {**env, **(extra or {})}

    def fresh(self) -> Path:
        self.n += 1
        d = self.root / f"case{self.n}"
        d.mkdir()
        return d

    def close(self) -> None:
        try:
            mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        except OSError:
            mounts = []
        for mnt in mounts:  # a full-disk case's tmpfs
            if mnt.startswith(str(self.root)):
                subprocess.run(["umount", "-l", mnt], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


def run_case(ws: Workspace, case: Case) -> Result:
    d = ws.fresh()
    argv = case.build(ws, d)
    t0 = time.perf_counter()
    proc = subprocess.Popen([ws.python, "-m", "armorlab.cli", *argv], cwd=d, env=ws.env(case.env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=case.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return Result(case, "hang", None, time.perf_counter() - t0, (out + err)[-600:])
    seconds = time.perf_counter() - t0
    text = out + err
    rc = proc.returncode
    if case.surface == "disk" and rc == FULL_DISK_EXIT:
        rc = 2  # a full disk's own exit code (armorlab.core.exits.EXIT_NO_SPACE) is its clean error
    if case.payload is not None and case.payload(ws, d, text):
        outcome = case.harm
    elif rc is not None and rc < 0:
        outcome = "segfault"
    elif rc not in (0, 2) or "Traceback" in err:
        outcome = "traceback"
    elif rc == 0 and case.expect == "error":
        outcome = "accepted"
    elif rc == 2 and case.expect == "ok":
        outcome = "refused"
    elif case.names and not all(n in text for n in case.names):
        outcome = "unnamed"
    elif rc == 0 and case.check is not None and not case.check(ws, d):
        outcome = "wrong"
    else:
        outcome = "ok" if rc == 0 else "error"
    return Result(case, outcome, rc, seconds, text[-600:])


def available(need: str | None) -> bool:
    if need is None:
        return True
    if need == "mount":
        probe = Path(tempfile.mkdtemp(prefix="armorlab-mount-probe-"))
        try:
            ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "probe", str(probe)],
                                capture_output=True).returncode == 0
            if ok:
                subprocess.run(["umount", str(probe)], capture_output=True)
            return ok
        finally:
            probe.rmdir()
    if need == "postgres":
        url = os.environ.get("ARMORLAB_POSTGRES_URL")
        if not url:
            return False
        host, _, port = url.partition("@")[2].partition("/")[0].partition(":")
        try:
            socket.create_connection((host, int(port or 5432)), timeout=3).close()
            return True
        except OSError:
            return False
    if need == "slurm":
        return shutil.which("sbatch") is not None and subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, timeout=30).stdout.count("UP") > 0
    return False


# --------------------------------------------------------------------------- helpers for cases
def _yaml(path: Path, data) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


def _spec(d: Path, base: dict, **extra) -> list[str]:
    spec = _yaml(d / "spec.yaml", {"name": "fz", "base": base, **extra})
    return ["sweep", str(spec), "--dry-run", "--root", str(d / "runs")]


def _with_profile(d: Path, profile: dict, base: dict | None = None) -> list[str]:
    prof = _yaml(d / "profile.yaml", profile)
    return [*_spec(d, base or {"max_steps": 3}), "--profile", str(prof)]


def _completed_run(ws: Workspace, d: Path) -> Path:
    """A copy of the healthy sweep's first run (completed): `train --run-dir` has nothing to train."""
    src = sorted(p for p in ws.sweep.iterdir() if p.is_dir())[0]
    dst = d / "sw" / src.name
    shutil.copytree(src, dst)
    return dst


def _sweep_copy(ws: Workspace, d: Path) -> Path:
    dst = d / "sw"
    shutil.copytree(ws.sweep, dst)
    return dst


def _victim(sweep: Path) -> Path:
    return sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))[0]


def _math(ws: Workspace, path: str | Path, **task) -> dict:
    return {"task": {"name": "math", "path": str(path), "val_size": 2, "test_size": 2, **task}}


def _check_task(ws: Workspace, d: Path, model: str | Path | None = None, data: str | Path | None = None,
                **task) -> list[str]:
    cfg = _yaml(d / "cfg.yaml", {**_math(ws, data or ws.data, **task), "model": str(model or ws.model),
                                 "max_completion_length": 8})
    return ["check-task", str(cfg), "--rows", "1"]


def _model_copy(ws: Workspace, d: Path) -> Path:
    dst = d / "model"
    shutil.copytree(ws.model, dst)
    return dst


def _damaged_model(damage: Callable[[Path], None]) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        m = _model_copy(ws, d)
        damage(m)
        return _check_task(ws, d, model=m)
    return build


def _marker(ws: Workspace, d: Path, text: str) -> bool:
    return (d / "PWNED").exists()


def _leaks(*secrets: str) -> Callable[[Workspace, Path, str], bool]:
    def check(ws: Workspace, d: Path, text: str) -> bool:
        if any(s in text for s in secrets):
            return True
        for p in d.rglob("*"):
            if p.is_file() and not p.is_symlink():
                data = p.read_bytes()
                if any(s.encode() in data for s in secrets):
                    return True
        return False
    return check


def _mkfifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _loop(path: Path) -> Path:
    os.symlink(path.name, path)  # a link to itself
    return path


def _deep_json(depth: int) -> bytes:
    return b'{"step": 2, "x": ' + b"[" * depth + b"]" * depth + b"}"


# --------------------------------------------------------------------------- §1 security
def _owner_symlink(ws: Workspace, d: Path) -> list[str]:
    run = _completed_run(ws, d)
    (d / "precious.txt").write_text("ORIGINAL")
    os.symlink(d / "precious.txt", run / "owner.lock")
    return ["train", "--run-dir", str(run)]


def _owner_kind(kind: str, command: str) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        run = _completed_run(ws, d)
        if kind == "dir":
            (run / "owner.lock").mkdir()
        else:
            _mkfifo(run / "owner.lock")
        if command == "status":
            status = json.loads((run / "status.json").read_text())
            (run / "status.json").write_text(json.dumps({**status, "state": "running", "ended": None}))
            return ["status", str(run.parent)]
        return ["train", "--run-dir", str(run)]
    return build


def _tune_spec(d: Path, **search) -> Path:
    return _yaml(d / "study.yaml", {"name": "st", "base": {"objective": "armor", "max_steps": 10, "val_every": 5},
                                    "search": {"space": {"alpha": [0.5, 0.7]}, "sampler": {"type": "grid"},
                                               **search}})


def _tune_with(url: str) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        return ["tune", str(_tune_spec(d)), "--root", str(d / "runs"), "--storage", url]
    return build


def _tune_real_pg(ws: Workspace, d: Path) -> list[str]:
    from urllib.parse import unquote

    url = os.environ["ARMORLAB_POSTGRES_URL"]
    user, password = url.partition("://")[2].partition("@")[0].split(":", 1)
    spelled = "".join(f"%{ord(c):02X}" for c in unquote(password))  # greppable: appears nowhere else
    db = f"armorlab_fuzz_{os.getpid()}_{ws.n}"
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}"')
        conn.execute(f'CREATE DATABASE "{db}"')
    secret_url = url.replace(f"{user}:{password}@", f"{user}:{spelled}@").rpartition("/")[0] + f"/{db}"
    (d / "secret").write_text(spelled)
    return ["tune", str(_tune_spec(d)), "--root", str(d / "runs"), "--storage", secret_url, "--workers", "2"]


def _pg_leak(ws: Workspace, d: Path, text: str) -> bool:
    secret = (d / "secret").read_text()
    return _leaks(secret, "armorlab:armorlab")(ws, d / "runs", text)


def _wrong_pg_password(ws: Workspace, d: Path) -> list[str]:
    url = os.environ["ARMORLAB_POSTGRES_URL"]
    user, password = url.partition("://")[2].partition("@")[0].split(":", 1)
    return _tune_with(url.replace(f"{user}:{password}@", f"{user}:Wrong-Pw-4711@"))(ws, d)


def _dashboard_quoting(ws: Workspace, d: Path) -> list[str]:
    """A study in SQLite at a path with `$(...)` in it; the case then runs the printed dashboard line
    through sh as a user pasting it would (with optuna-dashboard replaced by `true`)."""
    url = f"sqlite:///{d}/$(touch PWNED).db"  # a file name sqlite accepts; sh would run it in the case dir
    return ["tune", str(_tune_spec(d)), "--root", str(d / "runs"), "--storage", url]


def _pasted_dashboard(ws: Workspace, d: Path, text: str) -> bool:
    line = next((ln for ln in text.splitlines() if ln.startswith("dashboard: ")), None)
    if line is not None:
        cmd = line.removeprefix("dashboard: ").replace("optuna-dashboard", "true", 1)
        subprocess.run(["sh", "-c", cmd], cwd=d, capture_output=True, timeout=30)
    return (d / "PWNED").exists()


def _bash_env_job(ws: Workspace, d: Path) -> list[str]:
    """A real Slurm job whose profile exports BASH_ENV: bash would source it before the job script."""
    evil = d / "evil.sh"
    evil.write_text(f"touch {d}/PWNED\n")
    spec = _yaml(d / "spec.yaml", {"name": "fzbash", "base": {"max_steps": 1, "val_every": 0}})
    prof = _yaml(d / "profile.yaml", {"executor": "slurm", "time_min": 5, "sbatch": {"export": f"ALL,BASH_ENV={evil}"}})
    return ["sweep", str(spec), "--root", str(d / "runs"), "--profile", str(prof)]


def _bash_env_ran(ws: Workspace, d: Path, text: str) -> bool:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and "queued" in text:
        if (d / "PWNED").exists():
            break
        time.sleep(2)
    jobs = d / "runs" / "fzbash"
    if jobs.is_dir():  # never leave the job running
        subprocess.run([sys.executable, "-m", "armorlab.cli", "cancel", str(jobs)], env=ws.env(), capture_output=True)
    return (d / "PWNED").exists()


SECURITY = [
    Case("security", "owner.lock symlink (completed run)", _owner_symlink, names=("owner.lock", "symlink"),
         payload=lambda ws, d, t: (d / "precious.txt").read_text() != "ORIGINAL", timeout=120),
    Case("security", "owner.lock directory: train", _owner_kind("dir", "train"), names=("owner.lock",), timeout=120),
    Case("security", "owner.lock FIFO: train", _owner_kind("fifo", "train"), names=("owner.lock", "FIFO"),
         timeout=120),
    Case("security", "owner.lock FIFO: status of a running run", _owner_kind("fifo", "status"), expect="ok"),
    Case("security", "owner.lock directory: status of a running run", _owner_kind("dir", "status"), expect="ok"),
    Case("security", "storage password in the URL (unreachable)",
         _tune_with("postgresql://me:Sekr1t-pw@127.0.0.1:1/db"), names=("--storage",),
         payload=_leaks("Sekr1t-pw"), timeout=120),
    Case("security", "storage password as ?password=", _tune_with("postgresql://me@127.0.0.1:1/db?password=Sekr2t-pw"),
         names=("--storage",), payload=_leaks("Sekr2t-pw"), timeout=120),
    Case("security", "storage password holding '@'", _tune_with("postgresql://me:Se@kr3t-pw@127.0.0.1:1/db"),
         names=("--storage",), payload=_leaks("Se@kr3t-pw", "kr3t-pw"), timeout=120),
    Case("security", "storage password in a tune run on PostgreSQL", _tune_real_pg, expect="ok", payload=_pg_leak,
         env={"ARMORLAB_TRAIN_COMMAND": json.dumps([sys.executable, "-m", "armorlab.tune.synthetic_trainer"]),
              "ARMORLAB_SYNTHETIC_STEP_S": "0.01"}, timeout=600, slow=True, needs="postgres"),
    Case("security", "wrong storage password says authentication failed", _wrong_pg_password,
         names=("authentication failed",), payload=_leaks("Wrong-Pw-4711"), timeout=120, needs="postgres"),
    Case("security", "dashboard line pasted into a shell", _dashboard_quoting, expect="ok", payload=_pasted_dashboard,
         env={"ARMORLAB_TRAIN_COMMAND": json.dumps([sys.executable, "-m", "armorlab.tune.synthetic_trainer"]),
              "ARMORLAB_SYNTHETIC_STEP_S": "0.01"}, timeout=600, slow=True),
    Case("security", "sbatch export BASH_ENV (dry run)", lambda ws, d: _with_profile(
        d, {"executor": "slurm", "sbatch": {"export": f"ALL,BASH_ENV={d}/evil.sh"}}), names=("BASH_ENV", "sbatch")),
    Case("security", "sbatch export ENV", lambda ws, d: _with_profile(d, {"sbatch": {"export": "ALL,ENV=/tmp/x"}}),
         names=("ENV",)),
    Case("security", "sbatch export of an exported bash function", lambda ws, d: _with_profile(
        d, {"sbatch": {"export": "ALL,BASH_FUNC_ls%%=() { touch PWNED; }"}}), names=("BASH_FUNC",)),
    Case("security", "sbatch export LD_PRELOAD", lambda ws, d: _with_profile(
        d, {"sbatch": {"export": "NONE,LD_PRELOAD=/tmp/evil.so"}}), names=("LD_PRELOAD",)),
    Case("security", "sbatch export-file", lambda ws, d: _with_profile(d, {"sbatch": {"export-file": "/tmp/env"}}),
         names=("export-file",)),
    Case("security", "sbatch export BASH_ENV on a real job", _bash_env_job, payload=_bash_env_ran,
         names=("BASH_ENV",), timeout=180, slow=True, needs="slurm"),
    Case("security", "vllm_servers env BASH_ENV", lambda ws, d: _with_profile(
        d, {"vllm_servers": {"policy": {"gpus": 0, "env": {"BASH_ENV": f"{d}/evil.sh"}}}}),
        names=("vllm_servers.policy.env", "BASH_ENV")),
    Case("security", "vllm_servers env ENV", lambda ws, d: _with_profile(
        d, {"vllm_servers": {"ref": {"gpus": 0, "env": {"ENV": "/tmp/x"}}}}), names=("vllm_servers.ref.env",)),
    Case("security", "NUL in vllm_servers args", lambda ws, d: _with_profile(
        d, {"vllm_servers": {"policy": {"gpus": 0, "args": ["--dtype", "bf\x0016"]}}}),
        names=("vllm_servers.policy.args", "NUL")),
    Case("security", "NUL in vllm_servers env", lambda ws, d: _with_profile(
        d, {"vllm_servers": {"policy": {"gpus": 0, "env": {"X": "a\x00b"}}}}), names=("vllm_servers.policy.env", "NUL")),
    Case("security", "NUL in vllm_servers command", lambda ws, d: _with_profile(
        d, {"vllm_servers": {"command": ["vllm\x00", "serve"], "policy": {"gpus": 0}}}), names=("vllm_servers.command",)),
    Case("security", "shell in a spec name", lambda ws, d: ["sweep", str(_yaml(d / "s.yaml", {
        "name": f"$(touch {d}/PWNED)", "base": {"max_steps": 3}})), "--dry-run", "--root", str(d / "runs")],
        names=("name",), payload=_marker),
]


# --------------------------------------------------------------------------- §2 data
def _long_answer(ws: Workspace, d: Path) -> list[str]:
    rows = [json.dumps({"problem": f"q{i}", "answer": str(i)}) for i in range(12)]
    rows[3] = '{"problem": "big", "answer": ' + "9" * 5000 + "}"
    (d / "d.jsonl").write_text("\n".join(rows) + "\n")
    return _check_task(ws, d, data=d / "d.jsonl")


def _deep_line(ws: Workspace, d: Path) -> list[str]:
    rows = [json.dumps({"problem": f"q{i}", "answer": str(i)}) for i in range(12)]
    rows[5] = '{"problem": "x", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (d / "d.jsonl").write_text("\n".join(rows) + "\n")
    return _check_task(ws, d, data=d / "d.jsonl")


def _saved(kind: str) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        ds = d / "ds"
        ds.mkdir()
        if kind == "state":
            (ds / "state.json").write_text("{}")
            (ds / "dataset_info.json").write_text("{}")
        elif kind == "dict":
            (ds / "dataset_dict.json").write_text("{}")
        elif kind == "fifo":
            (ds / "state.json").write_text("{}")
            _mkfifo(ds / "data-00000-of-00001.arrow")
        elif kind == "loop":
            (ds / "state.json").write_text("{}")
            _loop(ds / "data-00000-of-00001.arrow")
        elif kind == "dangling":
            (ds / "state.json").write_text("{}")
            os.symlink(d / "gone.arrow", ds / "data-00000-of-00001.arrow")
        elif kind == "dirloop":
            (ds / "state.json").write_text("{}")
            os.symlink("..", ds / "up")
        return _check_task(ws, d, data=ds) if kind in ("state", "dict") else \
            _spec(d, _math(ws, ds))
    return build


def _data_path(kind: str) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        p = d / "data.jsonl"
        if kind == "loop":
            _loop(p)
        elif kind == "fifo":
            _mkfifo(p)
        elif kind == "dir":
            p.mkdir()
        return _spec(d, _math(ws, p))
    return build


def _rows(lines: list[str]) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        good = [json.dumps({"problem": f"q{i}", "answer": str(i)}) for i in range(12)]
        (d / "d.jsonl").write_text("\n".join(good[:4] + lines + good[4:]) + "\n")
        return _check_task(ws, d, data=d / "d.jsonl")
    return build


DATA = [
    Case("data", "a 5,000-digit answer", _long_answer, names=("line 4",), timeout=180, slow=True),
    Case("data", "deep nesting in a JSONL line", _deep_line, names=("line 6",), timeout=180, slow=True),
    Case("data", "save_to_disk dir with state.json: {}", _saved("state"), names=("task.path",), timeout=180,
         slow=True),
    Case("data", "save_to_disk dir with dataset_dict.json: {}", _saved("dict"), names=("task.path",), timeout=180,
         slow=True),
    Case("data", "a FIFO inside a save_to_disk dir", _saved("fifo"), names=("FIFO", "task.path"), timeout=30),
    Case("data", "a symlink loop inside a save_to_disk dir", _saved("loop"), names=("symlink loop",)),
    Case("data", "a dangling symlink inside a save_to_disk dir", _saved("dangling"), names=("dangling",)),
    Case("data", "a link to its parent inside a save_to_disk dir (not followed: no endless walk)",
         _saved("dirloop"), expect="ok", timeout=30),
    Case("data", "task.path is a symlink loop", _data_path("loop"), names=("symlink loop", "task.path")),
    Case("data", "task.path is a FIFO", _data_path("fifo"), names=("not a regular file", "task.path"), timeout=30),
    Case("data", "task.path is an empty dir", _data_path("dir"), names=("task.path",)),
    Case("data", "a JSONL line that is a list", _rows(["[1, 2]"]), names=("line 5", "not a JSON object"),
         timeout=180, slow=True),
    Case("data", "an answer that is an object", _rows(['{"problem": "p", "answer": {"a": 1}}']),
         names=("task.answer_key",), timeout=180, slow=True),
    Case("data", "a torn JSONL line", _rows(['{"problem": "p", "ans']), names=("line 5",), timeout=180, slow=True),
    Case("data", "a parquet file of garbage", lambda ws, d: (
        (d / "d.parquet").write_bytes(b"PAR1garbage"), _check_task(ws, d, data=d / "d.parquet"))[1],
        names=("task.path",), timeout=180, slow=True),
    Case("data", "val/test defaults exceed a small file", lambda ws, d: ["train", str(_yaml(
        d / "cfg.yaml", {"task": {"name": "math", "path": str(ws.data)}})), "--out", str(d / "runs")],
        names=("cfg.yaml", "task.val_size", "val_size: 4"), timeout=120),
]


# --------------------------------------------------------------------------- §2 model dirs
def _rm(*names: str) -> Callable[[Path], None]:
    def damage(m: Path) -> None:
        for n in names:
            (m / n).unlink(missing_ok=True)
    return damage


def _write(name: str, data: bytes | str) -> Callable[[Path], None]:
    def damage(m: Path) -> None:
        (m / name).unlink(missing_ok=True)
        (m / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return damage


def _edit_config(**changes) -> Callable[[Path], None]:
    def damage(m: Path) -> None:
        cfg = json.loads((m / "config.json").read_text())
        cfg.update(changes)
        (m / "config.json").write_text(json.dumps(cfg))
    return damage


def _truncate(name: str) -> Callable[[Path], None]:
    def damage(m: Path) -> None:
        data = (m / name).read_bytes()
        (m / name).write_bytes(data[: len(data) // 2])
    return damage


def _sharded_missing(m: Path) -> None:
    (m / "model.safetensors").rename(m / "model-00001-of-00002.safetensors")
    (m / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))


def _index_garbage(m: Path) -> None:
    (m / "model.safetensors").rename(m / "model-00001-of-00001.safetensors")
    (m / "model.safetensors.index.json").write_text("{not json")


def _config_dir(m: Path) -> None:
    (m / "config.json").unlink()
    (m / "config.json").mkdir()


def _dangling_weights(m: Path) -> None:
    (m / "model.safetensors").unlink()
    os.symlink(m / "blobs" / "gone", m / "model.safetensors")


def _tokenizer_gone(m: Path) -> None:
    for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (m / n).unlink(missing_ok=True)


def _model_path(kind: str) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        p = d / "model"
        if kind == "file":
            p.write_text("not a model")
        elif kind == "loop":
            _loop(p)
        return _check_task(ws, d, model=p)
    return build


MODEL = [
    Case("model", name, _damaged_model(damage), names=("model",), timeout=240, slow=True)
    for name, damage in [
        ("no weights", _rm("model.safetensors")),
        ("config.json not JSON", _write("config.json", "{model_type: llama")),
        ("config.json a list", _write("config.json", "[1, 2]")),
        ("config.json without model_type", _write("config.json", "{}")),
        ("an unknown model_type", _edit_config(model_type="no_such_architecture")),
        ("heads that do not divide the hidden size", _edit_config(num_attention_heads=3)),
        ("an empty model.safetensors", _write("model.safetensors", b"")),
        ("a truncated model.safetensors", _truncate("model.safetensors")),
        ("a model.safetensors of garbage", _write("model.safetensors", b"\xff" * 4096)),
        ("an index naming a missing shard", _sharded_missing),
        ("an index that is not JSON", _index_garbage),
        ("no tokenizer", _tokenizer_gone),
        ("tokenizer.json not JSON", _write("tokenizer.json", "{\"model\": ")),
        ("tokenizer_config.json not JSON", _write("tokenizer_config.json", "]")),
        ("config.json a directory", _config_dir),
        ("a dangling weights symlink", _dangling_weights),
        ("generation_config.json not JSON", _write("generation_config.json", "{")),
        ("a FIFO in the model dir", lambda m: _mkfifo(m / "notes.txt")),
        ("a symlink loop in the model dir", lambda m: _loop(m / "extra.bin")),
    ]
] + [
    Case("model", "model path is a file", _model_path("file"), names=("model",), timeout=120),
    Case("model", "model path is a symlink loop", _model_path("loop"), names=("model", "symlink loop"), timeout=120),
]


# --------------------------------------------------------------------------- §2 run dirs
def _run_damage(files: dict[str, Callable[[Path], None]], command: str) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        sweep = _sweep_copy(ws, d)
        victim = _victim(sweep)
        for name, damage in files.items():
            damage(victim / name)
        if command == "status":
            return ["status", str(sweep)]
        return ["report", str(sweep), "--out", str(d / "rep"), "--no-cache"]
    return build


def _append(data: bytes) -> Callable[[Path], None]:
    def damage(p: Path) -> None:
        with open(p, "ab") as fh:
            fh.write(data + b"\n")
    return damage


def _replace_with(data: bytes) -> Callable[[Path], None]:
    return lambda p: p.write_bytes(data)


def _fifo_instead(p: Path) -> None:
    p.unlink()
    _mkfifo(p)


def _running(p: Path) -> None:
    status = json.loads(p.read_text())
    p.write_text(json.dumps({**status, "state": "failed", "reason": "x[red]y " * 12_500}))


def _cache_damage(change: Callable[[Path], None]) -> Callable[[Workspace, Path], list[str]]:
    """A sweep whose metrics.arrow was written by a report, then damaged; the report runs with the cache."""
    def build(ws: Workspace, d: Path) -> list[str]:
        sweep = _sweep_copy(ws, d)
        subprocess.run([ws.python, "-m", "armorlab.cli", "report", str(sweep), "--out", str(d / "truth")],
                       env=ws.env(), capture_output=True, timeout=600, cwd=d)
        subprocess.run([ws.python, "-m", "armorlab.cli", "report", str(sweep), "--out", str(d / "truth"),
                        "--no-cache"], env=ws.env(), capture_output=True, timeout=600, cwd=d)
        change(sweep / ".armorlab-cache" / "metrics.arrow")
        return ["report", str(sweep), "--out", str(d / "rep")]
    return build


def _same_scores(ws: Workspace, d: Path) -> bool:
    """The cached report's per-run scores equal the --no-cache report's (the truth)."""
    try:
        return (d / "rep" / "tables" / "runs.csv").read_text() == (d / "truth" / "tables" / "runs.csv").read_text()
    except OSError:
        return False


def _arrow_meta(change: Callable[[dict], dict]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        import pyarrow as pa

        table = pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all()
        key = next(k for k in (table.schema.metadata or {}) if b"armorlab" in k)
        meta = change(json.loads(table.schema.metadata[key]))
        table = table.replace_schema_metadata({key: json.dumps(meta).encode()})
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    return damage


def _rotate_rows(meta: dict) -> dict:
    names = list(meta["runs"])
    ranges = [meta["runs"][n]["rows"] for n in names]
    rotated = names[-1:] + names[:-1]
    meta["runs"] = {n: {**meta["runs"][n], "rows": r} for n, r in zip(rotated, ranges, strict=True)}
    return meta


RUN_DIRS = [
    Case("run_dir", "deep nesting in metrics.jsonl: report", _run_damage(
        {"metrics.jsonl": _append(_deep_json(200_000))}, "report"), expect="ok", timeout=300),
    Case("run_dir", "deep nesting in metrics.jsonl: status", _run_damage(
        {"metrics.jsonl": _append(_deep_json(200_000))}, "status"), expect="ok"),
    Case("run_dir", "deep nesting in status.json: status", _run_damage(
        {"status.json": _replace_with(b"[" * 200_000)}, "status"), expect="ok"),
    Case("run_dir", "deep nesting in status.json: report", _run_damage(
        {"status.json": _replace_with(b"[" * 200_000)}, "report"), expect="ok", timeout=300),
    Case("run_dir", "deep nesting in config.yaml: status", _run_damage(
        {"config.yaml": _replace_with(b"[" * 5000)}, "status"), expect="ok"),
    Case("run_dir", "a 100 KB reason: status", _run_damage({"status.json": _running}, "status"), expect="ok",
         timeout=20),
    Case("run_dir", "status.json is a FIFO: status", _run_damage({"status.json": _fifo_instead}, "status"),
         expect="ok", timeout=30),
    Case("run_dir", "metrics.jsonl is a FIFO: status", _run_damage({"metrics.jsonl": _fifo_instead}, "status"),
         expect="ok", timeout=30),
    Case("run_dir", "metrics.jsonl is a FIFO: report", _run_damage({"metrics.jsonl": _fifo_instead}, "report"),
         expect="ok", timeout=120),
    Case("run_dir", "config.yaml is a FIFO: status", _run_damage({"config.yaml": _fifo_instead}, "status"),
         expect="ok", timeout=30),
    Case("run_dir", "a step past int64 in metrics.jsonl: report", _run_damage(
        {"metrics.jsonl": _append(b'{"step": ' + b"9" * 5000 + b', "val/acc": 1}')}, "report"), expect="ok",
         timeout=300),
] + [
    Case("run_dir", f"metrics.arrow {name}", _cache_damage(change), expect="ok", check=_same_scores, timeout=600,
         slow=True)
    for name, change in [
        ("truncated", lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])),
        ("of garbage", lambda p: p.write_bytes(b"\x00garbage" * 200)),
        ("with metadata that is no object", _arrow_meta(lambda m: ["x"])),
        ("without its runs", _arrow_meta(lambda m: {"version": m["version"]})),
        ("with rows out of range", _arrow_meta(lambda m: {**m, "runs": {
            k: {**v, "rows": [0, 10**6]} for k, v in m["runs"].items()}})),
        ("with entries of the wrong types", _arrow_meta(lambda m: {**m, "runs": {
            k: {**v, "metrics_key": "x", "config": 3, "warnings": 5} for k, v in m["runs"].items()}})),
        ("with rows shifted between runs", _arrow_meta(_rotate_rows)),
    ]
]


# --------------------------------------------------------------------------- §2 TRL vLLM fields and values
SERVER = {"use_vllm": True, "vllm_mode": "server"}
VLLM = [
    Case("vllm", name, lambda ws, d, base=base: _spec(d, base), names=names)
    for name, base, names in [
        ("vllm_server_port 0", {**SERVER, "vllm_server_port": 0}, ("vllm_server_port",)),
        ("vllm_server_port 70000", {**SERVER, "vllm_server_port": 70000}, ("vllm_server_port",)),
        ("vllm_group_port 0", {**SERVER, "vllm_group_port": 0}, ("vllm_group_port",)),
        ("server and group on one port", {**SERVER, "vllm_server_port": 8000, "vllm_group_port": 8000},
         ("vllm_group_port",)),
        ("vllm_gpu_memory_utilization 1.5", {"use_vllm": True, "vllm_gpu_memory_utilization": 1.5},
         ("vllm_gpu_memory_utilization",)),
        ("vllm_gpu_memory_utilization 0", {"use_vllm": True, "vllm_gpu_memory_utilization": 0},
         ("vllm_gpu_memory_utilization",)),
        ("vllm_tensor_parallel_size 0", {"use_vllm": True, "vllm_tensor_parallel_size": 0},
         ("vllm_tensor_parallel_size",)),
        ("vllm_mode bogus", {"use_vllm": True, "vllm_mode": "bogus"}, ("vllm_mode", "colocate")),
        ("vllm_server_host with a newline", {**SERVER, "vllm_server_host": "local\nhost"}, ("vllm_server_host",)),
        ("vllm_server_timeout -1", {**SERVER, "vllm_server_timeout": -1}, ("vllm_server_timeout",)),
        ("one server named twice (localhost vs 127.0.0.1)", {
            **SERVER, "vllm_server_host": "localhost", "vllm_server_port": 8000, "objective": "armor", "anchor": True,
            "ref_vllm_mode": "server", "ref_vllm_server_host": "127.0.0.1", "ref_vllm_server_port": 8000},
         ("ref_vllm_server_port",)),
        ("two colocated engines over the whole memory", {
            "use_vllm": True, "vllm_gpu_memory_utilization": 0.7, "objective": "armor", "anchor": True,
            "ref_vllm_mode": "colocate", "ref_vllm_memory": 0.5}, ("ref_vllm_memory",)),
    ]
] + [
    Case("vllm", "use_vllm: true without vLLM, train", lambda ws, d: ["train", str(_yaml(d / "c.yaml", {
        "use_vllm": True, "max_steps": 1, "val_every": 0, "task": {"name": "arithmetic", "train_size": 8},
        "per_device_train_batch_size": 16})), "--out", str(d / "runs")],
        names=("use_vllm", "not installed"), timeout=600, slow=True,
        env={"ARMORLAB_CACHE": os.environ.get("ARMORLAB_CACHE") or str(Path(tempfile.gettempdir()) / "armorlab-test-cache")}),
]

VALUES = [
    Case("values", name, lambda ws, d, base=base: _spec(d, base), expect=expect, names=names)
    for name, base, expect, names in [
        ("scale_rewards: bogus", {"scale_rewards": "bogus"}, "error", ("scale_rewards", "group, batch, none")),
        ("scale_rewards: false", {"scale_rewards": False}, "ok", ()),
        ("scale_rewards: true", {"scale_rewards": True}, "ok", ()),
        ("report_to: nonexistent_tracker", {"report_to": "nonexistent_tracker"}, "error", ("report_to", "tensorboard")),
        ("model.hidden_size 1e12", {"model": {"name": "tiny", "hidden_size": 1.0e12}}, "error", ("model.hidden_size",)),
        ("optim: bogus", {"optim": "adamw_bogus"}, "error", ("optim", "adamw_torch")),
        ("lr_scheduler_type: bogus", {"lr_scheduler_type": "cosinus"}, "error", ("lr_scheduler_type", "cosine")),
        ("three problems at once", {"optim": "x", "lr_scheduler_type": "y", "learnign_rate": 1}, "error",
         ("optim", "lr_scheduler_type", "learnign_rate", "3 problems")),
        ("a top-level typo", {"max_step": 10}, "error", ("did you mean 'max_steps'",)),
        ("max_completion_length beyond the tiny model", {"max_completion_length": 4096}, "error",
         ("max_completion_length", "1024")),
    ]
] + [
    Case("values", "a 5,000-digit int", lambda ws, d: ["sweep", str(_write_text(
        d / "s.yaml", "name: fz\nbase:\n  max_steps: " + "7" * 5000 + "\n")), "--dry-run"],
        names=("max_steps", "5,000 digits")),
    Case("values", "deep YAML nesting", lambda ws, d: ["sweep", str(_write_text(
        d / "s.yaml", "name: fz\nbase: " + "[" * 5000 + "]" * 5000 + "\n")), "--dry-run"], names=("s.yaml",)),
    Case("values", "deep YAML nesting (block)", lambda ws, d: ["sweep", str(_write_text(
        d / "s.yaml", "name: fz\nbase:\n" + "".join("  " * (i + 1) + "a:\n" for i in range(900)))), "--dry-run"],
        names=("s.yaml",)),
    Case("values", "--out is a file: train", lambda ws, d: (_write_text(d / "f", "x"), [
        "train", "--set", "max_steps=1", "--out", str(d / "f")])[1], names=("--out",)),
    Case("values", "--root is a file: sweep", lambda ws, d: (_write_text(d / "f", "x"), [
        "sweep", str(_yaml(d / "s.yaml", {"name": "fz", "base": {"max_steps": 3}})), "--root", str(d / "f")])[1],
        names=("--root",)),
    Case("values", "--out under a file: report", lambda ws, d: (_write_text(d / "f", "x"), [
        "report", str(ws.sweep), "--out", str(d / "f" / "rep")])[1], names=("--out",)),
    Case("values", "recipe out: a file", lambda ws, d: (_write_text(d / "f", "x"), [
        "report", str(_yaml(d / "r.yaml", {"runs": [str(ws.sweep)], "out": str(d / "f")}))])[1], names=("out",)),
    Case("values", "a batch no 64-row set can fill", lambda ws, d: ["train", str(_yaml(d / "c.yaml", {
        **_math(ws, ws.data, val_size=8, test_size=8), "model": str(ws.model), "per_device_train_batch_size": 4096,
        "max_steps": 2, "val_every": 0, "max_completion_length": 8})), "--out", str(d / "runs")],
        names=("per_device_train_batch_size", "no step"), timeout=600, slow=True),
]


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- §3 a full disk
def _full_disk(ws: Workspace, d: Path) -> list[str]:
    mnt = d / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", f"fz{ws.n}", str(mnt)], check=True)
    cfg = _yaml(d / "c.yaml", {"max_steps": 4, "save_steps": 2, "val_every": 0, "kl_probe_prompts": 0,
                               "per_device_train_batch_size": 16, "task": {"name": "arithmetic", "train_size": 8}})
    return ["train", str(cfg), "--out", str(mnt / "runs")]


def _full_disk_said(ws: Workspace, d: Path, text: str) -> bool:
    subprocess.run(["umount", "-l", str(d / "disk")], capture_output=True)
    return False


DISK = [
    Case("disk", "training onto a full disk", _full_disk, names=("no space left on device (checkpoint at step 2)",),
         payload=_full_disk_said, timeout=900, slow=True, needs="mount",
         env={"ARMORLAB_CACHE": os.environ.get("ARMORLAB_CACHE") or str(Path(tempfile.gettempdir()) / "armorlab-test-cache")}),
]
# a full disk is no user error: its exit code is armorlab.core.exits.EXIT_NO_SPACE (not imported:
# the cases also measure checkouts that lack it)
FULL_DISK_EXIT = 74


# --------------------------------------------------------------------------- §4 new user
def _help_example(ws: Workspace, d: Path) -> list[str]:
    out = subprocess.run([ws.python, "-m", "armorlab.cli", "sweep", "--help"], env=ws.env({"COLUMNS": "300"}),
                         capture_output=True, text=True, timeout=60).stdout
    example = " ".join(out.split()).split("e.g. ", 1)[1].split(" (changes", 1)[0].split()
    spec = _yaml(d / "s.yaml", {"name": "fz", "base": {"max_steps": 3}})
    return ["sweep", str(spec), "--dry-run", "--root", str(d / "runs"), *example]


def _slow_scontrol(ws: Workspace, d: Path) -> list[str]:
    (d / "bin").mkdir()
    (d / "bin" / "scontrol").write_text("#!/bin/sh\nsleep 9\n")
    (d / "bin" / "scontrol").chmod(0o755)
    return _spec(d, {"max_steps": 3})


def _logging_key_change(ws: Workspace, d: Path) -> list[str]:
    cfg = {"max_steps": 1, "val_every": 0, "kl_probe_prompts": 0, "per_device_train_batch_size": 16,
           "task": {"name": "arithmetic", "train_size": 8}}
    first = _yaml(d / "c.yaml", cfg)
    subprocess.run([ws.python, "-m", "armorlab.cli", "train", str(first), "--out", str(d / "runs")],
                   env=ws.env({"ARMORLAB_CACHE": _shared_cache()}), capture_output=True, timeout=1200, cwd=d)
    return ["train", str(first), "--out", str(d / "runs"), "--set", "logging_steps=5"]


def _shared_cache() -> str:
    return os.environ.get("ARMORLAB_CACHE") or str(Path(tempfile.gettempdir()) / "armorlab-test-cache")


NEW_USER = [
    Case("new_user", "status of the run dir train prints", lambda ws, d: ["status", str(_completed_run(ws, d))],
         expect="ok"),
    Case("new_user", "sweep --help's --set example", _help_example, expect="ok"),
    Case("new_user", "a local dry run with a hanging scontrol", _slow_scontrol, expect="ok", timeout=8,
         env={"PATH": "bin:" + os.environ.get("PATH", "")}),
    Case("new_user", "check-task with model: tiny on the user's data", lambda ws, d: ["check-task", str(_yaml(
        d / "c.yaml", _math(ws, ws.data, val_size=4, test_size=4))), "--rows", "1"], expect="ok",
        names=("does not train",), timeout=300, slow=True),
    Case("new_user", "a logging key changed", _logging_key_change, expect="ok",
         names=("not part of the run id",), timeout=900, slow=True, env={"ARMORLAB_CACHE": _shared_cache()}),
]

# --------------------------------------------------------------------------- issue 41 (round 4)
KEYS = b"ssh-ed25519 AAAA first\nssh-ed25519 BBBB second-without-newline"  # a torn tail a mender would cut


def _canaries(d: Path) -> Path:
    """A file and a dir outside every run dir, holding what armorlab writes or deletes by those names."""
    out = d / "outside"
    for name in ("checkpoint-1", "checkpoint-2"):
        (out / name).mkdir(parents=True)
        (out / name / "weights.bin").write_bytes(b"precious")
    for name in ("metrics.arrow", "metrics.parquet", ".gitignore", ".armorlab-report.json", "index.html"):
        (out / name).write_bytes(b"precious")
    (d / "authorized_keys").write_bytes(KEYS)
    (d / "canaries.json").write_text(json.dumps(_snapshot(d)))
    return out


def _snapshot(d: Path) -> dict[str, str]:
    files = [d / "authorized_keys", *sorted((d / "outside").rglob("*"))]
    return {str(p): p.read_bytes().hex() if p.is_file() else "<dir>" for p in files}


def _canaries_changed(ws: Workspace, d: Path, text: str) -> bool:
    return _snapshot(d) != json.loads((d / "canaries.json").read_text())


def _planted(where: str, command: str) -> Callable[[Workspace, Path], list[str]]:
    """A healthy sweep copy with a link planted at ``where`` (relative to its first run, or to the
    sweep dir for a leading '../'); ``command`` runs on it."""
    def build(ws: Workspace, d: Path) -> list[str]:
        sweep = _sweep_copy(ws, d)
        run = _victim(sweep)
        out = _canaries(d)
        if command == "train":  # a run to resume, not one already completed: train would write
            status = json.loads((run / "status.json").read_text())
            (run / "status.json").write_text(json.dumps({**status, "state": "failed", "reason": "killed"}))
        link = (run / where).resolve() if where.startswith("..") else run / where
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)
        elif link.exists() or link.is_symlink():
            link.unlink()
        link.parent.mkdir(parents=True, exist_ok=True)
        target = d / "authorized_keys" if where.endswith((".jsonl", ".json", ".html")) else out
        link.symlink_to(target, target_is_directory=target.is_dir())
        if command == "train":
            return ["train", "--run-dir", str(run)]
        if command == "report-run":
            return ["report", str(run)]
        return ["report", str(sweep), "--out", str(d / "rep")] if command == "report-sweep" else ["status", str(sweep)]
    return build


def _planted_report_file(name: str) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        sweep = _sweep_copy(ws, d)
        _canaries(d)
        (d / "rep").mkdir()
        (d / "rep" / name).symlink_to(d / "authorized_keys")
        return ["report", str(sweep), "--out", str(d / "rep")]
    return build


def _reader(name: str, kind: str, command: str) -> Callable[[Workspace, Path], list[str]]:
    """A FIFO or a /dev/zero link where armorlab reads a small file of a sweep or report dir."""
    def build(ws: Workspace, d: Path) -> list[str]:
        sweep = _sweep_copy(ws, d)
        path = (d / "rep" / name) if command == "report" and name.startswith(".armorlab") else sweep / name
        path.parent.mkdir(parents=True, exist_ok=True)
        _mkfifo(path) if kind == "fifo" else path.symlink_to("/dev/zero")
        return ["report", str(sweep), "--out", str(d / "rep")] if command == "report" else ["status", str(sweep)]
    return build


def _plan_with(fields: dict | str) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        m = _model_copy(ws, d)
        cfg = json.loads((m / "config.json").read_text())
        (m / "config.json").write_text(fields if isinstance(fields, str) else json.dumps({**cfg, **fields}))
        return ["plan", str(_yaml(d / "c.yaml", {"model": str(m)}))]
    return build


def _answers(answer: str) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        rows = [json.dumps({"problem": f"q{i}", "answer": str(i)}) for i in range(12)]
        rows[4] = '{"problem": "q4", "answer": ' + answer + "}"
        (d / "d.jsonl").write_text("\n".join(rows) + "\n")
        return _check_task(ws, d, data=d / "d.jsonl")
    return build


def _alias_bomb(ws: Workspace, d: Path) -> list[str]:
    lines = ["name: fz", "base: {max_steps: 3}", 'l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 8) + "]" for i in range(1, 10)]
    (d / "s.yaml").write_text("\n".join(lines) + "\n")
    return ["sweep", str(d / "s.yaml"), "--dry-run", "--root", str(d / "runs")]


def _until_resolved(flag: str, value: str) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        spec = _yaml(d / "s.yaml", {"name": "ur", "base": {"max_steps": 3, "val_every": 1},
                                    "grid": {"objective": ["dapo", "armor"]}, "seeds": [0, 1],
                                    "compare": {"baseline": {"objective": "dapo"}, "delta": 0.05}})
        return ["sweep", str(spec), "--until-resolved", flag, value, "--dry-run", "--root", str(d / "runs")]
    return build


def _storage_in_spec(storage) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        return ["tune", str(_tune_spec(d, storage=storage)), "--root", str(d / "runs")]
    return build


def _leaks_beside_the_spec(secret: str) -> Callable[[Workspace, Path, str], bool]:
    """The secret in the output or a file armorlab wrote (the spec holding it is the case's input)."""
    return lambda ws, d, text: _leaks(secret)(ws, d / "runs", text)


def _template(template: str) -> Callable[[Path], None]:
    def damage(m: Path) -> None:
        cfg = json.loads((m / "tokenizer_config.json").read_text())
        (m / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    return damage


def _model_config(**fields) -> Callable[[Path], None]:
    def damage(m: Path) -> None:
        cfg = json.loads((m / "config.json").read_text())
        (m / "config.json").write_text(json.dumps({**cfg, **fields}).replace("1e+300", "1e12"))
    return damage


ROUND4 = [
    # writes through planted links: each canary must come through unchanged
    *[Case("symlinks", f"planted {where} link: {command}", _planted(where, command), payload=_canaries_changed,
           harm="writes_outside", expect=expect, names=names, timeout=180)
      for where, command, expect, names in (
          ("metrics.jsonl", "train", "error", ("metrics.jsonl", "symbolic link")),
          ("status.json", "train", "error", ("status.json", "symbolic link")),
          ("checkpoints", "train", "error", ("checkpoints", "symbolic link")),
          ("selected.json", "train", "error", ("selected.json", "symbolic link")),
          ("report", "report-run", "error", ("report", "symbolic link")),
          ("../.armorlab-cache", "report-sweep", "ok", ()),
          ("../.armorlab-cache", "status", "ok", ()))],
    *[Case("symlinks", f"planted report file link: {name}", _planted_report_file(name), payload=_canaries_changed,
           harm="writes_outside", names=("symbolic link",), timeout=180)
      for name in ("index.html", "recipe.yaml")],
    # small files read with a size cap and never blocking
    *[Case("readers", f"{name} is {'a FIFO' if kind == 'fifo' else 'a /dev/zero link'}: {command}",
           _reader(name, kind, command), expect="ok", timeout=60)  # read as absent (a report's stamp: stale)
      for name, command in (("looks.json", "status"), ("looks.json", "report"), (".armorlab-report.json", "report"))
      for kind in ("fifo", "zero")],
    # passwords in every URL form, and a storage of the wrong type
    Case("security", "storage user@server:password@host", _tune_with("postgresql://ann@srv:Sekr4t-azure@127.0.0.1:1/db"),
         names=("--storage",), payload=_leaks("Sekr4t-azure"), harm="secrets", timeout=120),
    Case("security", "storage as a libpq key=value string",
         _tune_with("host=127.0.0.1 port=1 user=ann password='Sekr5t lib' dbname=db"),
         names=("--storage",), payload=_leaks("Sekr5t"), harm="secrets", timeout=120),
    Case("security", "storage ?sslpassword=", _tune_with("postgresql://ann@127.0.0.1:1/db?sslpassword=Sekr6t-ssl"),
         names=("--storage", "sslpassword"), payload=_leaks("Sekr6t-ssl"), harm="secrets", timeout=120),
    Case("security", "storage ?PASSWORD= (upper case)", _tune_with("postgresql://ann@127.0.0.1:1/db?PASSWORD=Sekr7t-up"),
         names=("--storage",), payload=_leaks("Sekr7t-up"), harm="secrets", timeout=120),
    Case("security", "search.storage of the wrong type", _storage_in_spec({"url": "postgresql://a:Sekr8t-map@h/db"}),
         names=("search.storage",), payload=_leaks_beside_the_spec("Sekr8t-map"), harm="secrets", timeout=120),
    Case("security", "search.storage a libpq string", _storage_in_spec("host=h password=Sekr9t-spec"),
         names=("search.storage",), payload=_leaks_beside_the_spec("Sekr9t-spec"), harm="secrets", timeout=120),
    # sbatch's prefixes of --export-file, and exports that choose the code a job runs
    *[Case("security", f"sbatch {option}", lambda ws, d, option=option: _with_profile(
        d, {"executor": "slurm", "sbatch": {option: "/tmp/env"}}), names=("export-file",))
      for option in ("export-f", "export-fil", "export-")],
    *[Case("security", f"sbatch export {name}", lambda ws, d, name=name: _with_profile(
        d, {"executor": "slurm", "sbatch": {"export": f"ALL,{name}=/tmp/evil"}}), names=(name, "allow_exports"))
      for name in ("PATH", "PYTHONPATH", "PYTHONSTARTUP", "LD_LIBRARY_PATH", "PERL5OPT")],
    Case("security", "sbatch export PYTHONPATH allowed by the profile", lambda ws, d: _with_profile(
        d, {"executor": "slurm", "allow_exports": ["PYTHONPATH"], "sbatch": {"export": "ALL,PYTHONPATH=/opt/x"}}),
        expect="ok"),
    # wrong results that used to pass
    *[Case("values", f"plan: config.json {label}", _plan_with(fields), names=names)
      for label, fields, names in (("-28 layers", {"num_hidden_layers": -28}, ("num_hidden_layers", "-28")),
                                   ("vocab_size 1e12", '{"model_type": "llama", "vocab_size": 1e12}', ("vocab_size",)),
                                   ("0 heads", {"num_attention_heads": 0}, ("num_attention_heads",)),
                                   ("a list", "[1, 2]", ("JSON object",)),
                                   ("text_config a list", {"text_config": [1]}, ("JSON object",)))],
    *[Case("data", f"answer {answer}", _answers(answer), names=("not a finite number", "answer_key"))
      for answer in ("NaN", "1e400", "-Infinity", '"nan"', '"inf"')],
    Case("model", "vocab_size 1e12", _damaged_model(_model_config(vocab_size=1e300)), names=("vocab_size",)),
    Case("model", "a chat template that does not parse", _damaged_model(_template("{% for m in messages %}")),
         names=("chat template does not parse",)),
    Case("model", "a chat template that raises", _damaged_model(_template("{{ raise_exception('no user role') }}")),
         names=("chat template raises", "no user role")),
    Case("values", "a YAML alias bomb", _alias_bomb, names=("aliases",), timeout=20),
    Case("values", "--max-seeds 1000000000", _until_resolved("--max-seeds", "1000000000"), names=("--max-seeds",),
         timeout=30),
    Case("values", "--seeds-per-look 1000000000", _until_resolved("--seeds-per-look", "1000000000"),
         names=("--seeds-per-look",), timeout=30),
    *[Case("vllm", f"vllm-serve {flag} {value}", lambda ws, d, flag=flag, value=value: [
        "vllm-serve", "--model", str(ws.model), flag, value], names=(flag,), timeout=60)
      for flag, value in (("--port", "70000"), ("--port", "0"), ("--host", ""), ("--dtype", "fp7"),
                          ("--model", "/no/such/model"))],
]

# --------------------------------------------------------------------------- importers (issue 41)
# another library's files through `report`: a malformed record is a counted skip (exit 0, a warning)
# or an error naming the file; pyarrow's crash on deep nesting is a segfault here, not a traceback
_BRACES = json.dumps({"note": "}" * 10})[1:-1]  # closing braces in a string: a running depth falls by 10


def _verl_log(d: Path, lines: list[str]) -> Path:
    path = d / "exp.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _verl_lines(extra: list[str], n: int = 3) -> list[str]:
    return [json.dumps({"step": i + 1, "data": {"actor/loss": 0.5 / (i + 1)}}) for i in range(n)] + extra


def _imported(make: Callable[[Path], Path], runs_map: dict | None = None) -> Callable[[Workspace, Path], list[str]]:
    def build(ws: Workspace, d: Path) -> list[str]:
        src = make(d)
        argv = ["report", str(src), "--out", str(d / "rep")]
        return argv + ["--map", str(_yaml(d / "runs.yaml", {"runs": {str(src): runs_map}}))] if runs_map else argv
    return build


def _deep_among_ordinary(kind: str) -> Callable[[Path], Path]:
    """One 200,000-deep line after 20,000 ordinary ones whose strings hold closing braces."""
    deep = "[" * 200_000 + "]" * 200_000

    def make(d: Path) -> Path:
        if kind == "verl":
            return _verl_log(d, [json.dumps({"step": i + 1, "data": {"actor/loss": 0.5}})[:-2] + ", " + _BRACES + "}}"
                                 for i in range(20_000)] + ['{"step": 20001, "data": {"x": ' + deep + "}}"])
        from importer_writers import write_trackio_db

        rows = [("r", i, "'" + json.dumps({"train/loss": 0.5, "note": "}" * 10}) + "'") for i in range(20_000)]
        return write_trackio_db(d / "proj.db", [*rows, ("r", 20_000, "'{\"x\": " + deep + "}'")])
    return make


def _dumps(make_dir: Callable[[Path], None]) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        (d / "dumps").mkdir()
        (d / "dumps" / "1.jsonl").write_text(json.dumps({"input": "q", "score": 1.0}) + "\n")
        make_dir(d / "dumps")
        return _verl_log(d, _verl_lines([]))
    return make


def _trackio_rows(*rows: tuple, configs: tuple = ()) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        from importer_writers import write_trackio_db

        good = [("a", i, "'" + json.dumps({"train/loss": 1.0 / (i + 1)}) + "'") for i in range(3)]
        return write_trackio_db(d / "proj.db", [*good, *rows], list(configs))
    return make


def _tensorboard(tag: str, **tensor) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        w = EventFileWriter(str(d / "tb"))
        for step, value in ((1, summary_pb2.Summary.Value(tag="train/loss", simple_value=0.5)),
                            (2, summary_pb2.Summary.Value(tag=tag, tensor=tensor_pb2.TensorProto(
                                tensor_shape=tensor_shape_pb2.TensorShapeProto(), **tensor)))):
            w.add_event(event_pb2.Event(step=step, summary=summary_pb2.Summary(value=[value])))
        w.close()
        return d / "tb"
    return make


def _wandb(*records: Callable[[], bytes], fifo: bool = False) -> Callable[[Path], Path]:
    def make(d: Path) -> Path:
        from importer_writers import write_wandb_records
        from wandb.proto import wandb_internal_pb2 as pb

        folder = d / "wandb" / "offline-run-20260101_000000-abc123"
        if fifo:
            folder.mkdir(parents=True)
            _mkfifo(folder / "run-abc123.wandb")
            return folder
        ok = pb.Record(history=pb.HistoryRecord(item=[pb.HistoryItem(key="train/loss", value_json="0.5")],
                                                step=pb.HistoryStep(num=1))).SerializeToString()
        write_wandb_records(folder / "run-abc123.wandb", [ok, *(r() for r in records)])
        return folder
    return make


def _wandb_garbage(field_name: str) -> Callable[[], bytes]:
    def record() -> bytes:
        from importer_writers import pb_field
        from wandb.proto import wandb_internal_pb2 as pb

        return pb_field(pb.Record.DESCRIPTOR.fields_by_name[field_name].number, b"\x0a\xff\xff\xff\xff\x0f")
    return record


def _wandb_deep(where: str) -> Callable[[], bytes]:
    def record() -> bytes:
        from wandb.proto import wandb_internal_pb2 as pb

        deep = "[" * 5000 + "]" * 5000
        if where == "history":
            return pb.Record(history=pb.HistoryRecord(item=[pb.HistoryItem(key="train/loss", value_json=deep)],
                                                      step=pb.HistoryStep(num=2))).SerializeToString()
        return pb.Record(config=pb.ConfigRecord(update=[pb.ConfigItem(key="lr", value_json=deep)])).SerializeToString()
    return record


IMPORTERS = [
    *[Case("importers", f"{kind}: one deep line among 20,000", _imported(_deep_among_ordinary(kind)), expect="ok",
           timeout=180) for kind in ("verl", "trackio")],
    *[Case("importers", f"verl: step {label}", _imported(lambda d, line=line: _verl_log(d, _verl_lines([line]))),
           expect="ok") for label, line in (("2**63", '{"step": 9223372036854775808, "data": {"actor/loss": 1}}'),
                                            ("2**64", '{"step": 18446744073709551616, "data": {"actor/loss": 1}}'),
                                            ("1e300", '{"step": 1e300, "data": {"actor/loss": 1}}'),
                                            ("-1", '{"step": -1, "data": {"actor/loss": 1}}'))],
    Case("importers", "verl: val_dumps naming a file", _imported(_dumps(lambda p: None), {"val_dumps": "dumps/1.jsonl"}),
         names=("val_dumps", "must be a directory")),
    Case("importers", "verl: a 249-digit dump name", _imported(
        _dumps(lambda p: (p / f"{'9' * 249}.jsonl").write_text("{}\n")), {"val_dumps": "dumps"}), expect="ok"),
    Case("importers", "verl: a dump is a FIFO", _imported(_dumps(lambda p: _mkfifo(p / "2.jsonl")), {"val_dumps": "dumps"}),
         expect="ok", names=("FIFO",), timeout=30),
    Case("importers", "verl: a dump is a /dev/zero link",
         _imported(_dumps(lambda p: (p / "2.jsonl").symlink_to("/dev/zero")), {"val_dumps": "dumps"}), expect="ok",
         names=("character device",), timeout=30),
    Case("importers", "verl: the log is a FIFO", _imported(lambda d: _mkfifo(d / "exp.jsonl")), names=("exp.jsonl",),
         timeout=30),
    *[Case("importers", f"trackio: {label}", _imported(make), expect="ok", names=names) for label, make, names in (
        ("NULL step", _trackio_rows(("a", None, "'{}'")), ("skipped 1 rows",)),
        ("'abc' step", _trackio_rows(("a", "abc", "'{}'")), ("skipped 1 rows",)),
        ("1e300 step", _trackio_rows(("a", 1e300, "'{}'")), ("skipped 1 rows",)),
        ("NULL metrics", _trackio_rows(("a", 5, "NULL")), ()),  # a row without values: nothing to plot
        ("non-UTF-8 metrics", _trackio_rows(("a", 5, "CAST(x'ff7b7d' AS TEXT)")), ("not a JSON object",)),
        ("a list config", _trackio_rows(configs=(("a", "[1, 2]"),)), ("not a JSON object",)),
        ("NULL run name", _trackio_rows((None, 0, "'{\"train/loss\": 2}'")), ()),
        ("trainer step 1e300", _trackio_rows(("a", 3, "'{\"train/global_step\": 1e300, \"train/loss\": 9}'")),
         ("rows without the trainer's step",)))],
    Case("importers", "tensorboard: DT_HALF past 16 bits", _imported(_tensorboard("train/x", dtype=19, half_val=[70000])),
         expect="ok"),
    Case("importers", "tensorboard: deep text_summary", _imported(_tensorboard(
        "args/text_summary", dtype=7, string_val=[b"[" * 200_000 + b"]" * 200_000])), expect="ok"),
    *[Case("importers", f"wandb: {label}", _imported(make), expect=expect, names=names, timeout=30)
      for label, make, expect, names in (
          ("history record of the wrong type", _wandb(_wandb_garbage("history")), "ok", ("not W&B history rows",)),
          ("run record of the wrong type", _wandb(_wandb_garbage("run")), "ok", ("record skipped",)),
          ("config record of the wrong type", _wandb(_wandb_garbage("config")), "ok", ("record skipped",)),
          ("deep value_json", _wandb(_wandb_deep("history")), "ok", ()),
          ("deep config value_json", _wandb(_wandb_deep("config")), "ok", ()),
          ("the .wandb file is a FIFO", _wandb(fifo=True), "ok", ("FIFO",)))],
]

CASES: list[Case] = [*SECURITY, *DATA, *MODEL, *RUN_DIRS, *VLLM, *VALUES, *DISK, *NEW_USER, *ROUND4, *IMPORTERS]
SURFACES = tuple(dict.fromkeys(c.surface for c in CASES))
