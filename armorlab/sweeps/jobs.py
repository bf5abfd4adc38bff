"""The callable a sweep job runs: ``python -m armorlab.cli train --run-dir DIR`` in a subprocess.

The pickled payload holds the run directory and how to launch (python or accelerate): the job
finds its config, its checkpoints and its status in the run dir, so a requeued job resumes from
whatever the last attempt left there, and no value from a spec ever meets a shell. A run whose
dir a sweep has not written yet (a fresh Slurm submission: writing 1,000 run dirs cost more than
submitit's own work) also carries its resolved config: the job writes the run dir (config.yaml
first, fsync'd) before it starts the trainer; its requeues carry the path only.

Preemption and time limits follow submitit's checkpoint protocol: when Slurm signals the job
(``--signal=USR2@signal_delay_s`` before the time limit, or ``scancel --signal``), submitit calls
``TrainJob.checkpoint()``; it forwards SIGUSR1 to the trainer, which finishes its optimizer step,
saves a checkpoint, writes status "pending" and exits 75 (contract C3). ``checkpoint()`` then
returns a fresh ``TrainJob`` for the same run dir and submitit requeues the job.

With a profile's ``vllm_servers`` the job starts the run's vLLM server(s) first and stops them
when the trainer exits (armorlab.vllm.servers).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from armorlab.core.exits import EXIT_BUSY, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, describe_exit
from armorlab.core.fsutil import open_append
from armorlab.core.runs import FINAL_STATES, RunDir, slurm_job_id
from armorlab.vllm.servers import RunningServers, ServerError, ServerSet, StartStopped, server_model

if TYPE_CHECKING:
    from submitit.helpers import DelayedSubmission

log = logging.getLogger(__name__)

# A JSON list of argv words that replaces `python -m armorlab.cli train` (the job appends
# `--run-dir DIR`). For tests and benchmarks that need a stand-in trainer; never a shell string.
ENV_COMMAND = "ARMORLAB_TRAIN_COMMAND"
# How long a job whose trainer exited 75 on its own (SIGTERM reached it first) waits for
# submitit's checkpoint signal, which would requeue it, before giving up the attempt.
REQUEUE_SIGNAL_GRACE_S = 3.0


@dataclass(frozen=True)
class JobOutcome:
    run_dir: str
    returncode: int
    state: str            # the run's status.json state after the attempt
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class JobStopped(RuntimeError):
    """The trainer checkpointed and stopped (exit 75) but no requeue was asked for."""


class JobFailed(RuntimeError):
    """The trainer failed; the reason is in the run's status.json too."""




def train_argv(run_dir: str, *, launcher: str = "python", accelerate_config: str | None = None) -> list[str]:
    """The argv (no shell) that trains ``run_dir``."""
    override = os.environ.get(ENV_COMMAND)
    if override:
        prefix = json.loads(override)
        if not isinstance(prefix, list) or not prefix or not all(isinstance(w, str) for w in prefix):
            raise RuntimeError(f"{ENV_COMMAND} must be a JSON list of strings, got {override!r}")
        return [*prefix, "--run-dir", run_dir]
    tail = ["-m", "armorlab.cli", "train", "--run-dir", run_dir]
    if launcher == "python":
        return [sys.executable, *tail]
    if launcher == "accelerate":
        if not accelerate_config:
            raise RuntimeError("launcher 'accelerate' needs accelerate_config")
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", accelerate_config,
                *_multi_node_args(), *tail]
    raise RuntimeError(f"unknown launcher {launcher!r}")


def _multi_node_args() -> list[str]:
    """accelerate's rank arguments when submitit started this job on several Slurm nodes."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return []
    import submitit

    env = submitit.JobEnvironment()
    if env.num_nodes <= 1:
        return []
    return ["--num_machines", str(env.num_nodes), "--machine_rank", str(env.node),
            "--main_process_ip", env.hostnames[0]]


def _checkpoint_signal() -> int:
    """The signal submitit uses to ask for a checkpoint (USR2 unless SUBMITIT_PREEMPT_SIGNAL says)."""
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), signal.SIGUSR2)


# Exec wrapper (Linux): the trainer gets SIGTERM (checkpoint, exit 75) when the process that
# started it dies — a sweep killed with -9 or by a closed ssh session leaves no orphan training
# on, whose run dir a re-run would find taken; and it ignores argv[2] (0 = none): submitit's
# checkpoint signal, which Slurm sends to every process of the step (the job process forwards
# SIGUSR1 instead; a handler the trainer installs itself still wins over this "ignore"). An exec
# wrapper rather than preexec_fn: no Python code runs between fork and exec in a threaded parent.
_EXEC_WRAPPER = ("import ctypes,os,signal,sys;p=int(sys.argv[1]);p and ctypes.CDLL(None).prctl(1,signal.SIGTERM);"
                 "int(sys.argv[2]) and signal.signal(int(sys.argv[2]),signal.SIG_IGN);"
                 "p==0 or os.getppid()==p or os._exit(75);os.execvp(sys.argv[3],sys.argv[3:])")


def wrapped_argv(argv: list[str], *, die_with_parent: bool = True, ignore_signal: int = 0) -> list[str]:
    """``argv`` started through the exec wrapper (Linux): it gets SIGTERM when this process dies
    (unless ``die_with_parent`` is False) and ignores ``ignore_signal``; elsewhere unchanged."""
    if not sys.platform.startswith("linux") or (not die_with_parent and not ignore_signal):
        return list(argv)
    parent = os.getpid() if die_with_parent else 0
    return [sys.executable, "-c", _EXEC_WRAPPER, str(parent), str(ignore_signal), *argv]


class TrainJob:
    """Train one run directory. Picklable: holds the run dir path and launch options, plus the
    run's resolved config while its dir is not written yet (``config``).

    submitit requeues it through its ``checkpoint`` method (submitit finds the method by name, as
    on its ``helpers.Checkpointable``), so making TrainJobs — a sweep's submit makes 1,000s —
    imports no submitit."""

    def __init__(self, run_dir: str | os.PathLike, *, launcher: str = "python",
                 accelerate_config: str | None = None, detach: bool = False,
                 vllm_servers: ServerSet | None = None, config: dict[str, Any] | None = None) -> None:
        # an absolute str is taken as is: a sweep builds 1,000s of them from one absolute dir
        self.run_dir = run_dir if isinstance(run_dir, str) and os.path.isabs(run_dir) \
            else str(Path(run_dir).absolute())
        self.launcher = launcher
        self.accelerate_config = accelerate_config
        self.detach = detach  # the trainer outlives this process (local `armorlab sweep --detach`)
        self.vllm_servers = vllm_servers  # started on the node before the trainer
        self.config = config  # written to the run dir when the job starts, if it is not there yet
        self._proc: subprocess.Popen | None = None
        self._done = threading.Event()
        self._asked: set[int] = set()  # stop signals sent to this attempt's trainer
        self._servers: RunningServers | None = None
        self._stop_asked = threading.Event()  # a stop that came before the trainer was started

    def __repr__(self) -> str:
        return f"TrainJob({self.run_dir!r}, launcher={self.launcher!r})"

    def __getstate__(self) -> dict[str, Any]:
        # not `detach`: only local jobs detach, and they are never pickled
        state = {"run_dir": self.run_dir, "launcher": self.launcher, "accelerate_config": self.accelerate_config}
        if self.vllm_servers is not None:
            state["vllm_servers"] = self.vllm_servers
        if self.config is not None:
            state["config"] = self.config
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # .get: pickles queued by an armorlab without these fields still load
        self.__init__(state["run_dir"], launcher=state["launcher"], accelerate_config=state["accelerate_config"],
                      vllm_servers=state.get("vllm_servers"), config=state.get("config"))

    # ------------------------------------------------------------------ running
    def __call__(self) -> dict[str, Any]:
        """submitit's entry point: raise unless the run completed, so Slurm marks the job FAILED."""
        outcome = self.run()
        if outcome.returncode == EXIT_OK:
            return outcome.to_dict()
        if outcome.returncode == EXIT_BUSY:
            raise JobFailed(f"{self.run_dir}: {outcome.reason}")
        if outcome.returncode == EXIT_PREEMPTED:
            if os.environ.get("SUBMITIT_EXECUTOR") == "slurm":
                # SIGTERM reached the trainer before USR2 reached us: give submitit's handler a
                # moment to call checkpoint() and requeue (it exits this process if it does).
                deadline = time.monotonic() + REQUEUE_SIGNAL_GRACE_S
                while time.monotonic() < deadline:
                    time.sleep(0.1)
            raise JobStopped(f"{self.run_dir}: {outcome.reason or 'stopped'}; run the sweep again to resume")
        raise JobFailed(f"{self.run_dir}: {outcome.reason or describe_exit(outcome.returncode)}")

    def run(self, *, env: dict[str, str] | None = None, log_path: str | os.PathLike | None = None) -> JobOutcome:
        """Run one training attempt to its end and report how it ended."""
        rd = self._materialise()
        status = rd.read_status()
        if status["state"] in FINAL_STATES:  # a duplicate or late requeue: nothing to do
            return JobOutcome(self.run_dir, EXIT_OK, status["state"], status.get("reason"))
        owner = rd.owner()
        if owner is not None:  # a live trainer (e.g. an orphan of a killed sweep) has it: never a second
            return JobOutcome(self.run_dir, EXIT_BUSY, status["state"],
                              f"another live process owns this run dir (pid {owner.get('pid')} on "
                              f"{owner.get('host')})")
        slurm = os.environ.get("SUBMITIT_EXECUTOR") == "slurm"
        argv = wrapped_argv(train_argv(self.run_dir, launcher=self.launcher, accelerate_config=self.accelerate_config),
                            die_with_parent=not self.detach, ignore_signal=_checkpoint_signal() if slurm else 0)
        env = dict(env or {})
        server_death: str | None = None
        out: Any = None
        if log_path is not None:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            out = open_append(log_path)  # closed below, after the child exits
        try:
            self._done.clear()
            self._asked = set()
            if self.vllm_servers is not None:
                ended = self._start_servers(rd, env)  # on success env gains the trainer's GPUs and ports
                if ended is not None:
                    return ended
            log.info("starting %s", argv)
            self._proc = subprocess.Popen(
                argv, cwd=os.getcwd(), env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT if out is not None else None,
                # own process group: a terminal's Ctrl-C reaches the sweep, which forwards SIGTERM
                start_new_session=True,
            )
            # Wait in a helper thread: submitit's signal handler runs in this (main) thread and
            # calls checkpoint(), which must be able to wait for the child too (Popen.wait holds a
            # lock a handler re-entering it would deadlock on).
            threading.Thread(target=self._reap, daemon=True).start()
            if self._stop_asked.is_set():  # asked while the servers started: the trainer stops at once
                self.interrupt(signal.SIGTERM)
            while not self._done.wait(0.5):
                if self._servers is not None and server_death is None:
                    server_death = self._server_died()
            if self._servers is not None and server_death is None:
                server_death = self._server_died(stop_trainer=False)
        finally:
            if out is not None:
                out.close()
            if self._servers is not None:
                self._servers.stop()
        rc = self._proc.returncode
        status = rd.read_status()
        if server_death is not None and status["state"] not in FINAL_STATES:
            # the trainer's own reason would be a connection error, or "preempted" (we stopped it)
            status = rd.write_status("failed", reason=server_death)
            return JobOutcome(self.run_dir, EXIT_FAILED, status["state"], status.get("reason"))
        checkpointed = status["state"] == "pending" and str(status.get("reason") or "").startswith("preempted")
        if rc not in (EXIT_OK, EXIT_PREEMPTED) and checkpointed:
            # torchrun/accelerate report a process's exit 75 as their own 1 (or die of the
            # forwarded SIGTERM); the trainer recorded that it checkpointed and stopped
            rc = EXIT_PREEMPTED
        elif rc < 0 and -rc in self._asked and status["state"] in ("running", "pending"):
            # the stop signal we sent came before the trainer had its handler up (still
            # importing): a preemption with nothing to checkpoint yet, not a failed run
            status = rd.write_status("pending", reason=f"preempted during start-up ({describe_exit(rc)} "
                                     "before the trainer could checkpoint)")
            rc = EXIT_PREEMPTED
        if rc not in (EXIT_OK, EXIT_PREEMPTED, EXIT_BUSY) and status["state"] in ("running", "pending") \
                and rd.owner() is None:
            # the trainer died without recording why (killed, out of memory, crashed on start);
            # never said of a run another live process owns
            status = rd.write_status("failed", reason=f"training process ended with {describe_exit(rc)}")
        return JobOutcome(self.run_dir, rc, status["state"], status.get("reason"))

    def _start_servers(self, rd: RunDir, env: dict[str, str]) -> JobOutcome | None:
        """Start this attempt's vLLM servers and wait until they answer; None when they do (``env``
        then holds the trainer's CUDA_VISIBLE_DEVICES and the servers' ports), else the outcome."""
        assert self.vllm_servers is not None
        base = {**os.environ, **env}
        job = slurm_job_id(base) or base.get("ARMORLAB_JOB_ID")
        ignore = {_checkpoint_signal(), signal.SIGUSR1, signal.SIGUSR2}
        try:
            self._servers = RunningServers.plan(self.vllm_servers, rd, server_model(rd, base), base)
            if self._stop_asked.is_set():
                raise StartStopped()
            self._servers.start(base, ignore, attempt=rd.read_status()["attempt"] + 1, job_id=job)
            self._servers.wait_ready(self._stop_asked)
        except ServerError as exc:
            log.error("%s: %s", self.run_dir, exc)
            status = rd.write_status("failed", reason=str(exc), job_id=job)
            return JobOutcome(self.run_dir, EXIT_FAILED, status["state"], status.get("reason"))
        except StartStopped:
            status = rd.write_status("pending", reason="preempted while its vLLM servers started")
            return JobOutcome(self.run_dir, EXIT_PREEMPTED, status["state"], status.get("reason"))
        env.update(self._servers.endpoints_env())
        return None

    def _server_died(self, *, stop_trainer: bool = True) -> str | None:
        """The reason when a server died under the trainer; the trainer is asked to checkpoint and stop."""
        assert self._servers is not None
        try:
            self._servers.check_alive()
        except ServerError as exc:
            log.error("%s: %s", self.run_dir, exc)
            if stop_trainer:
                self.interrupt(signal.SIGTERM)
            return str(exc)
        return None

    def _materialise(self) -> RunDir:
        """The run dir, written now from the carried config if the sweep left that to the job.
        RunDir.create keeps an existing dir's files (same config = same run), so a duplicate
        or a late start of the same job changes nothing."""
        if self.config is None:
            return RunDir(self.run_dir)
        rd = RunDir.create(Path(self.run_dir).parent, self.config)
        if rd.path != Path(self.run_dir):  # the dir's name is the config's hash: a wrong pair is a bug
            raise RuntimeError(f"job for {self.run_dir} carries the config of run {rd.id}")
        return rd

    def _reap(self) -> None:
        assert self._proc is not None
        self._proc.wait()
        self._done.set()

    def interrupt(self, sig: int = signal.SIGUSR1) -> bool:
        """Ask the running trainer (its whole process group) to checkpoint and stop.

        A multi-process launcher gets SIGTERM instead: torchrun starts each trainer in a session
        of its own, out of reach of the group; it forwards SIGTERM to them (the trainers take it
        as a preemption too) and waits for them to exit.
        """
        proc = self._proc
        if proc is None and self.vllm_servers is not None and not self._done.is_set():
            self._stop_asked.set()  # the servers are starting: the start stops (or the trainer at once)
            return True
        if proc is None or proc.returncode is not None:
            return False
        if self.launcher != "python":
            sig = signal.SIGTERM
        self._asked.add(sig)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def wait(self, timeout: float | None = None) -> bool:
        return self._proc is None or self._done.wait(timeout)

    # ------------------------------------------------------------------ submitit protocol
    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission | None:
        """Called by submitit on the checkpoint signal: forward it, wait, requeue only the run dir."""
        from submitit.helpers import DelayedSubmission

        if self.interrupt(signal.SIGUSR1) and self._proc is not None:
            log.info("checkpoint requested: waiting for the trainer in %s", self.run_dir)
            self._done.wait()
        if self._servers is not None:  # before submitit requeues (and exits): no server outlives the job
            self._servers.stop()
        state = RunDir(self.run_dir).read_status()["state"]
        if state in (*FINAL_STATES, "failed"):
            return None  # nothing left to resume; submitit records why it did not requeue
        return DelayedSubmission(TrainJob(self.run_dir, launcher=self.launcher,
                                          accelerate_config=self.accelerate_config, vllm_servers=self.vllm_servers))
