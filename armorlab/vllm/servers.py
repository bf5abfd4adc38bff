"""vLLM servers started by each job on its node, before the trainer (a profile's ``vllm_servers:``).

```yaml
vllm_servers:
  command: [armorlab, vllm-serve]  # optional; default: the job's python -m armorlab.cli vllm-serve
  policy:                          # rollouts: the runs say use_vllm: true, vllm_mode: server
    gpus: 1                        # its own GPUs, taken first from the job's
    port: auto                     # a free port picked on the node at start (or a number)
    args: [--dtype, bfloat16]      # appended to: --model <run's model> --port P --host 127.0.0.1
    env: {VLLM_LOGGING_LEVEL: INFO}
    startup_timeout_s: 900         # GET /health must answer 200 by then
  ref:                             # anchors: the runs say ref_vllm_mode: server
    gpus: 1
```

Each attempt of a job: start the servers with ``CUDA_VISIBLE_DEVICES`` set to disjoint slices of
the job's GPUs (servers first, in the order policy, ref; the trainer gets the rest), wait for
their ``/health``, hand their ports to the trainer (armorlab.vllm.endpoints), train, and stop
the servers when the trainer exits. A server that dies or is not ready in time fails the run with
its log named; so does one that dies while the trainer runs (the trainer is asked to checkpoint
first). Logs and what was started go to the run dir's ``vllm/`` (``policy.log``, ``ref.log``,
``servers.json``).

Signals. Slurm signals every process of a job (scancel, preemption, the time-limit signal), so
the servers would die at once while the trainer still finishes its step, which may need them.
They are started shielded: SIGTERM blocked, the checkpoint signals ignored (both inherited across
exec and by their children); the job stops them with SIGINT (vLLM's and uvicorn's graceful stop)
and SIGKILLs their process group after a grace period. A server also gets SIGINT when the job
process dies (prctl), and Slurm's final SIGKILL reaches it at the end of a job: no orphans.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from armorlab.core.checks import Invalid, integer, no_nul, number, startup_hook
from armorlab.core.exits import describe_exit
from armorlab.core.fsutil import atomic_write_json, open_append
from armorlab.core.runs import RunDir, now_iso
from armorlab.errors import ArmorLabError
from armorlab.vllm.endpoints import ENV as ENDPOINTS_ENV
from armorlab.vllm.endpoints import ROLES, endpoint_config

HOST = "127.0.0.1"  # servers and trainer share the node: loopback only, nothing exposed
LOG_DIR = "vllm"
SERVERS_JSON = "servers.json"
STOP_GRACE_S = 30.0
DEFAULT_STARTUP_TIMEOUT_S = 600.0
# words the job itself passes; a profile setting them would start a server the trainer cannot find
_JOB_ARGS = ("--model", "--port", "--host")
_SERVER_KEYS = ("gpus", "port", "args", "env", "startup_timeout_s")


@dataclass(frozen=True)
class ServerSpec:
    role: str                        # policy | ref
    gpus: int = 1
    port: int | None = None          # None: a free port picked on the node at start
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S


@dataclass(frozen=True)
class ServerSet:
    servers: tuple[ServerSpec, ...]
    command: tuple[str, ...] | None = None   # None: <job python> -m armorlab.cli vllm-serve
    gpus_per_node: int = 0

    def roles(self) -> tuple[str, ...]:
        return tuple(s.role for s in self.servers)

    def server_gpus(self) -> int:
        return sum(s.gpus for s in self.servers)

    def base_command(self, python: str | None = None) -> list[str]:
        return list(self.command) if self.command else [python or sys.executable, "-m", "armorlab.cli",
                                                        "vllm-serve"]


# --------------------------------------------------------------------------- the profile section
def parse_servers(raw: Any, *, gpus_per_node: int, launcher: str, accelerate_config: str | None,
                  file: str, nodes: int = 1) -> ServerSet | None:
    """The ``vllm_servers`` section of a profile, checked against the profile's GPUs per node."""
    if raw is None:
        return None
    if nodes != 1:  # TRL's main process talks to the servers; on other nodes they would idle
        raise ArmorLabError("a job with vllm_servers runs on one node (servers and trainer side by side)",
                            key="nodes", value=nodes, file=file)
    if not isinstance(raw, Mapping) or not raw:
        raise ArmorLabError("must map roles (policy, ref) to server settings", key="vllm_servers", value=raw,
                            file=file)
    command = None
    servers = []
    for key, value in raw.items():
        if key == "command":
            command = _command(value, file)
        elif key in ROLES:
            servers.append(_server(key, value, file))
        else:
            raise ArmorLabError(f"unknown key (known: command, {', '.join(ROLES)})", key=f"vllm_servers.{key}",
                                value=value, file=file)
    if not servers:
        raise ArmorLabError("names no server: add policy and/or ref", key="vllm_servers", value=dict(raw), file=file)
    servers.sort(key=lambda s: ROLES.index(s.role))  # GPUs are handed out in this order
    fixed = [s.port for s in servers if s.port is not None]
    if len(set(fixed)) < len(fixed):
        raise ArmorLabError("the servers need different ports", key="vllm_servers.ref.port", value=fixed[-1],
                            file=file)
    out = ServerSet(tuple(servers), command, gpus_per_node)
    check_fit(out, launcher=launcher, accelerate_config=accelerate_config, file=file)
    return out


def _split(value: Any) -> Any:
    try:
        return shlex.split(value) if isinstance(value, str) else value
    except ValueError as exc:  # an unclosed quote
        raise Invalid(f"is not a command line ({exc})") from None


def _command(value: Any, file: str) -> tuple[str, ...]:
    try:
        words = _split(value)
    except Invalid as exc:
        raise ArmorLabError(str(exc), key="vllm_servers.command", value=value, file=file) from None
    if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words):
        raise ArmorLabError("must be a command line or a list of argv words", key="vllm_servers.command",
                            value=value, file=file)
    if any("\x00" in w for w in words):
        raise ArmorLabError("must not contain a NUL byte", key="vllm_servers.command", value=value, file=file)
    return tuple(words)


def _server(role: str, raw: Any, file: str) -> ServerSpec:
    where = f"vllm_servers.{role}"
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ArmorLabError(f"must map {', '.join(_SERVER_KEYS)} to values", key=where, value=raw, file=file)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        try:
            if key == "gpus":
                values[key] = integer(0)(value)
            elif key == "port":
                values[key] = None if value in (None, "auto") else integer(1024, 65535)(value)
            elif key == "args":
                values[key] = _args(value)
            elif key == "env":
                values[key] = _env(value)
            elif key == "startup_timeout_s":
                values[key] = number(0.0, lo_open=True)(value)
            else:
                raise ArmorLabError(f"unknown key (known: {', '.join(_SERVER_KEYS)})", key=f"{where}.{key}",
                                    value=value, file=file)
        except Invalid as exc:
            msg = f"{exc} (or auto)" if key == "port" else str(exc)
            raise ArmorLabError(msg, key=f"{where}.{key}", value=value, file=file) from None
    return ServerSpec(role=role, **values)


def _args(value: Any) -> tuple[str, ...]:
    words = _split(value)
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise Invalid("must be a list of argv words")
    for w in words:
        no_nul(w)
        if w.split("=", 1)[0] in _JOB_ARGS:
            raise Invalid(f"{w.split('=', 1)[0]} is set by the job (the run's model, the server's port and host)")
    return tuple(words)


def _env(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise Invalid("must map variable names to values")
    out = []
    for k, v in value.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise Invalid(f"{k!r} is not an environment variable name")
        if k in ("CUDA_VISIBLE_DEVICES", ENDPOINTS_ENV):
            raise Invalid(f"{k} is set by the job")
        if startup_hook(k):
            raise Invalid(f"{k} makes a shell or the loader run code when the server starts; refused")
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise Invalid(f"{k} needs a string or number")
        try:
            no_nul(v)
        except Invalid as exc:
            raise Invalid(f"{k} {exc}") from None
        out.append((k, str(v)))
    return tuple(out)


def check_fit(servers: ServerSet, *, launcher: str, accelerate_config: str | None, file: str) -> None:
    """The servers' GPUs fit the node's, leaving the trainer at least one (on a GPU profile), and an
    accelerate config starts one process per GPU left to the trainer."""
    asked, node = servers.server_gpus(), servers.gpus_per_node
    detail = " + ".join(f"{s.role} {s.gpus}" for s in servers.servers)
    key = f"vllm_servers.{servers.servers[-1].role}.gpus"
    if asked > node or (node > 0 and asked == node):
        raise ArmorLabError(f"the vLLM servers ask for {asked} GPU(s) ({detail}) of the node's gpus_per_node: "
                            f"{node}, and the trainer needs at least one of its own"
                            if node else f"the vLLM servers ask for {asked} GPU(s) ({detail}) but the profile "
                            "has gpus_per_node: 0 (CPU servers: gpus: 0)",
                            key=key, value=servers.servers[-1].gpus, file=file)
    if node and launcher == "accelerate" and accelerate_config:
        procs = _accelerate_processes(accelerate_config)
        if procs is not None and procs != node - asked:
            raise ArmorLabError(f"the trainer gets {node - asked} GPU(s) (gpus_per_node {node} − {asked} for "
                                f"vLLM servers in {file}) but the accelerate config starts {procs} processes: "
                                f"set num_processes: {node - asked}",
                                key="accelerate_config: num_processes", value=procs, file=accelerate_config)


def _accelerate_processes(path: str) -> int | None:
    import yaml

    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None  # the node may see files this machine does not; accelerate reports it there
    value = data.get("num_processes") if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None



# --------------------------------------------------------------------------- GPUs
def visible_devices(env: Mapping[str, str], gpus_per_node: int) -> list[str]:
    """The job's GPUs: Slurm's ``CUDA_VISIBLE_DEVICES`` when set, else 0..gpus_per_node−1."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is not None:
        return [d.strip() for d in raw.split(",") if d.strip()]
    return [str(i) for i in range(gpus_per_node)]


def split_devices(servers: ServerSet, devices: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Disjoint slices of ``devices``: each server's (policy first, then ref), then the trainer's rest."""
    need = servers.server_gpus() + (1 if servers.gpus_per_node else 0)
    if len(devices) < need:
        raise ServerError(f"the job sees {len(devices)} GPU(s) (CUDA_VISIBLE_DEVICES={','.join(devices)!r}) but its "
                          f"vLLM servers need {servers.server_gpus()} and the trainer at least "
                          f"{1 if servers.gpus_per_node else 0}")
    out, at = {}, 0
    for s in servers.servers:
        out[s.role] = list(devices[at:at + s.gpus])
        at += s.gpus
    return out, list(devices[at:])


# --------------------------------------------------------------------------- dry run
def describe(servers: ServerSet, *, python: str | None, trainer_argv: Sequence[str]) -> list[str]:
    """What each job runs on its node, as shell-like lines (``sweep --dry-run``)."""
    devices = visible_devices({}, servers.gpus_per_node)
    split, rest = split_devices(servers, devices) if len(devices) >= servers.server_gpus() else ({}, [])
    lines = ["# each job on its node, started by the job itself (armorlab/vllm/servers.py):"]
    for s in servers.servers:
        port = str(s.port) if s.port is not None else "<free port>"
        env = [f"CUDA_VISIBLE_DEVICES={','.join(split.get(s.role, []))}", *(f"{k}={v}" for k, v in s.env)]
        argv = [*servers.base_command(python), "--model", "<run's model>", "--port", port, "--host", HOST, *s.args]
        lines.append(f"{' '.join(shlex.quote(w) for w in env)} {shlex.join(argv)} \\")
        lines.append(f"    >> <run dir>/{LOG_DIR}/{s.role}.log 2>&1 &    # ready: GET http://{HOST}:{port}/health "
                     f"= 200 within {s.startup_timeout_s:g} s")
    keys = endpoint_config({s.role: (HOST, s.port or 0) for s in servers.servers})
    shown = ", ".join(f"{k}={'<its port>' if v == 0 else v}" for k, v in keys.items())
    lines.append(f"CUDA_VISIBLE_DEVICES={','.join(rest)} {ENDPOINTS_ENV}='{{{shown}}}' {shlex.join(trainer_argv)}")
    lines.append("# when the trainer exits (also on preemption/requeue/cancel): SIGINT to each server, SIGKILL "
                 f"after {STOP_GRACE_S:g} s")
    return lines


# --------------------------------------------------------------------------- running
class ServerError(RuntimeError):
    """A server could not be started, was not ready in time, or died: the run fails with this reason."""


class StartStopped(RuntimeError):
    """The job was asked to stop while its servers were starting."""


# Exec wrapper (Linux): SIGINT when the job process dies (argv[1] = its pid), SIGTERM blocked and
# the signals in argv[2] ignored (see the module docstring), then exec the server. SIGINT is reset
# to its default first: a job started in the background of a shell (`nohup armorlab sweep ... &`)
# inherits it ignored, and the server would then sit out the stop's grace period until SIGKILL.
_SERVER_WRAPPER = ("import ctypes,os,signal,sys;p=int(sys.argv[1]);signal.signal(signal.SIGINT,signal.SIG_DFL);"
                   "ctypes.CDLL(None).prctl(1,signal.SIGINT);"
                   "signal.pthread_sigmask(signal.SIG_BLOCK,[signal.SIGTERM]);"
                   "[signal.signal(int(s),signal.SIG_IGN) for s in sys.argv[2].split(',') if s];"
                   "os.getppid()==p or os._exit(75);os.execvp(sys.argv[3],sys.argv[3:])")


def shielded_argv(argv: Sequence[str], ignore: Iterable[int]) -> list[str]:
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-c", _SERVER_WRAPPER, str(os.getpid()), ",".join(str(int(s)) for s in ignore), *argv]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on loopback now (held together while picking, so they differ)."""
    import socket  # here: every sweep plan imports this module (check_runs), few pick ports

    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def healthy(port: int, timeout: float = 2.0) -> bool:
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via $http_proxy
    try:
        with opener.open(f"http://{HOST}:{port}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def last_line(path: Path, limit: int = 200) -> str | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 8192))
            lines = [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return None
    if not lines or lines[-1].startswith("--- "):
        return None
    return lines[-1][:limit]


@dataclass
class Server:
    spec: ServerSpec
    argv: list[str]
    port: int
    devices: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    ready: bool = False
    started_at: float = 0.0
    stopped: bool = False


@dataclass
class RunningServers:
    """The servers of one attempt: start → wait_ready → (trainer) → stop (idempotent)."""

    servers: list[Server]
    trainer_devices: list[str]
    run_dir: RunDir
    # re-entrant: stop() may run in a signal handler (submitit's checkpoint) that interrupted start()
    _lock: Any = field(default_factory=threading.RLock)

    @classmethod
    def plan(cls, spec: ServerSet, run_dir: RunDir, model: str, env: Mapping[str, str]) -> RunningServers:
        split, rest = split_devices(spec, visible_devices(env, spec.gpus_per_node))
        auto = iter(free_ports(sum(s.port is None for s in spec.servers)))
        servers = []
        for s in spec.servers:
            port = s.port if s.port is not None else next(auto)
            argv = [*spec.base_command(), "--model", model, "--port", str(port), "--host", HOST, *s.args]
            servers.append(Server(s, argv, port, split[s.role], run_dir.path / LOG_DIR / f"{s.role}.log"))
        return cls(servers, rest, run_dir)

    def endpoints_env(self) -> dict[str, str]:
        """What the trainer's environment gets: its GPUs and where the servers listen."""
        keys = endpoint_config({s.spec.role: (HOST, s.port) for s in self.servers})
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.trainer_devices), ENDPOINTS_ENV: json.dumps(keys)}

    def start(self, env: Mapping[str, str], ignore_signals: Iterable[int], *, attempt: int,
              job_id: str | None) -> None:
        (self.run_dir.path / LOG_DIR).mkdir(parents=True, exist_ok=True)
        ignore = list(ignore_signals)
        for s in self.servers:
            with open_append(s.log_path) as log:
                log.write(f"--- {now_iso()} attempt {attempt} (job {job_id or '-'}): {shlex.join(s.argv)} "
                          f"(CUDA_VISIBLE_DEVICES={','.join(s.devices)})\n".encode())
                log.flush()
                server_env = {**env, **dict(s.spec.env), "CUDA_VISIBLE_DEVICES": ",".join(s.devices)}
                server_env.pop(ENDPOINTS_ENV, None)
                with self._lock:
                    try:
                        s.proc = subprocess.Popen(shielded_argv(s.argv, ignore), env=server_env, stdout=log,
                                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                  start_new_session=True)  # its own group: stopped as one
                    except OSError as exc:
                        raise ServerError(f"cannot start the vLLM {s.spec.role} server "
                                          f"{shlex.join(s.argv)}: {exc.strerror or exc}") from None
                s.started_at = time.monotonic()
        self._record(attempt, job_id)

    def _record(self, attempt: int, job_id: str | None) -> None:
        atomic_write_json(self.run_dir.path / LOG_DIR / SERVERS_JSON, {
            "attempt": attempt, "job_id": job_id, "started": now_iso(), "trainer_cuda_visible_devices": ",".join(self.trainer_devices),
            "servers": {s.spec.role: {"argv": s.argv, "host": HOST, "port": s.port, "pid": s.proc.pid if s.proc else None,
                                      "cuda_visible_devices": ",".join(s.devices), "log": str(s.log_path)}
                        for s in self.servers}})

    def wait_ready(self, stop: threading.Event, poll_s: float = 0.25) -> None:
        """Until every server answers GET /health with 200; ServerError if one dies or times out."""
        while True:
            for s in self.servers:
                if s.ready:
                    continue
                self._check_alive(s, "before it was ready")
                if healthy(s.port):
                    s.ready = True
                elif time.monotonic() - s.started_at > s.spec.startup_timeout_s:
                    raise ServerError(f"vLLM {s.spec.role} server was not ready after {s.spec.startup_timeout_s:g} s "
                                      f"(GET http://{HOST}:{s.port}/health; log: {s.log_path})")
            if all(s.ready for s in self.servers):
                return
            if stop.wait(poll_s):
                raise StartStopped("stopped while the vLLM servers started")

    def _check_alive(self, s: Server, when: str) -> None:
        rc = s.proc.poll() if s.proc is not None else None
        if rc is not None and not s.stopped:
            last = last_line(s.log_path)
            said = f"; its last line: {last}" if last else ""
            raise ServerError(f"vLLM {s.spec.role} server exited with {describe_exit(rc)} {when}{said} "
                              f"(log: {s.log_path})")

    def check_alive(self, when: str = "while the trainer ran") -> None:
        for s in self.servers:
            self._check_alive(s, when)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGINT to each server's process group, SIGKILL after ``grace_s``; safe to call twice."""
        with self._lock:
            procs = [s for s in self.servers if s.proc is not None and not s.stopped]
            for s in procs:
                s.stopped = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(s.proc.pid, signal.SIGINT)
        deadline = time.monotonic() + grace_s
        for s in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                s.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            # also what the server left in its group (engine processes), and a server past its grace
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(s.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):  # never a blocking wait in a handler
                s.proc.wait(timeout=5)
            _wait_group_gone(s.proc.pid, timeout_s=5.0)


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Until no process of the group is left (SIGKILLed ones take a moment to go; zombies until reaped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


def server_model(run_dir: RunDir, env: Mapping[str, str]) -> str:
    """The model the servers load: the run's model path or hub id; armorlab's tiny model is built
    (or found in $ARMORLAB_CACHE) by a helper process, so the job itself never imports torch. A run
    that continues from another (``init_from``) serves the checkpoint that run selected, as its
    trainer loads it for the policy and π_ref."""
    cfg = run_dir.read_config()
    if cfg.get("init_from"):  # a continuing run: the checkpoint its parent selected (armorlab.train.init_from)
        code = ("import sys;from armorlab.core.runs import RunDir;from armorlab.train.init_from import find_start;"
                "rd=RunDir(sys.argv[1]);print(find_start(rd,rd.read_config()['init_from']).checkpoint)")
        out = subprocess.run([sys.executable, "-c", code, str(run_dir.path)], capture_output=True, text=True,
                             env=dict(env), cwd=os.getcwd())
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise ServerError(f"cannot find the checkpoint this run continues from: {tail}")
        return out.stdout.strip().splitlines()[-1]
    model = cfg.get("model")
    name = model.get("name") if isinstance(model, Mapping) else model
    if name not in (None, "tiny"):
        return str(name)
    code = ("import json,sys;from armorlab.train.models import prepare_model;c=json.load(sys.stdin);"
            "print(prepare_model(c.get('model') or 'tiny', c.get('task') or {}))")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps({"model": model, "task": cfg.get("task")}),
                         capture_output=True, text=True, env=dict(env), cwd=os.getcwd())
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ServerError(f"cannot build the tiny model for the vLLM servers: {tail}")
    return out.stdout.strip().splitlines()[-1]
