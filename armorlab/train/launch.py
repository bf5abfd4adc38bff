"""Run one training job in a run directory: the process contract sweeps and tune rely on (C3).

``train_run_dir(DIR)`` trains the resolved config in ``DIR/config.yaml``:
- status.json: ``running`` (attempt + 1, job id from ``$SLURM_ARRAY_JOB_ID_$SLURM_ARRAY_TASK_ID``,
  ``$SLURM_JOB_ID`` or ``$ARMORLAB_JOB_ID``) → ``completed``, or ``failed`` with a one-line reason;
- exit codes: 0 completed, 1 failed, 2 user/config error (status failed too), 75 preempted,
  73 another live process owns the run dir (its ``owner.lock``): nothing touched, 74 the disk
  is full (status failed, reason "no space left on device (checkpoint at step N)"; the
  half-written checkpoint is removed, and a run started again resumes from the last complete one);
- a dir with checkpoints resumes from the last *complete* one (model, optimizer, scheduler, RNG,
  π_ref, anchor cache, TRL's generation buffer, step); metrics.jsonl is appended to, and readers
  keep the last line per step, so steps the killed attempt logged after that checkpoint are
  superseded;
- checkpoints: one at every validation step besides ``save_steps``; kept are the last
  ``save_total_limit``, the ``keep_checkpoints`` best by the noise-aware validation level and
  ``selected.json`` naming the best (armorlab.train.keep); the rest are pruned as the run goes;
- SIGUSR1/SIGTERM: finish the current optimizer step, checkpoint, status ``pending`` with
  reason ``preempted at step N``, exit 75 (submitit requeues the job);
- ``DIR/stop_request`` (JSON ``{"reason": ...}``): stop after the current step, status
  ``completed`` with reason ``stopped at step N: <reason>``, exit 0 (Optuna pruning);
- ``stop_on_collapse``: once the validation curve has collapsed (armorlab.train.stopper), stop
  after that eval step's checkpoint, status ``stopped`` with reason ``collapse at rollout N, level
  fell k SE``, exit 0; selected.json keeps the peak, and a stopped run is final like a completed one;
- a non-finite loss stops the run: ``failed`` / ``non-finite loss at step N``, exit 1;
- several processes (``torchrun ... -m armorlab train`` or ``accelerate launch --multi_gpu``):
  every process trains, only the main one (rank 0) writes status.json (with ``world_size``),
  metrics.jsonl and prints, except that a process that fails records why. torchrun and
  accelerate turn any non-zero exit of a process into their own exit code 1: status.json, not
  the launcher's exit code, says whether the run was preempted or failed.

Nothing but the run dir (and the job id in the environment) describes the run; a job that started
vLLM servers for it adds where they listen (``$ARMORLAB_VLLM_ENDPOINTS``: host/port keys applied
on top of config.yaml, not part of the run id; armorlab.vllm.endpoints). torch and TRL are
imported only after the config has been resolved, so a bad config fails in well under a second.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from armorlab.core.config import FIELDS, load_config, resolve, split_config
from armorlab.core.exits import EXIT_BUSY, EXIT_FAILED, EXIT_NO_SPACE, EXIT_OK, EXIT_PREEMPTED
from armorlab.core.fsutil import (
    SMALL_FILE_BYTES,
    read_regular_text,
    refuse_symlinks,
    remove_tree,
    writable_dir,
)
from armorlab.core.runs import FINAL_STATES, RunDir, describe_owner, slurm_job_id
from armorlab.core.vllm_config import check_vllm_installed
from armorlab.errors import ArmorLabError
from armorlab.train.init_from import (
    check_optimizer_state,
    continual_warmup_args,
    find_reference,
    find_start,
    parent_optimizer_callback,
    record_start,
)
from armorlab.vllm.endpoints import read_endpoints

log = logging.getLogger(__name__)

STOP_REQUEST = "stop_request"
PREEMPT_SIGNALS = tuple(s for s in (getattr(signal, "SIGUSR1", None), signal.SIGTERM) if s is not None)


@dataclass(frozen=True)
class Outcome:
    path: Path
    state: str
    reason: str | None
    exit_code: int
    already_completed: bool = False  # nothing was trained: the run dir was completed before
    # armorlab.core.health's, as status.json records them; after training, those its log has not
    # shown while the run trained (each is shown once)
    warnings: tuple[str, ...] = ()
    note: str | None = None  # what the user should know about this outcome (train prints it)


def process_layout(env: dict[str, str] | None = None) -> tuple[int, int]:
    """(rank, world size) of this process as torchrun/accelerate (or mpirun) announce them; (0, 1) alone.

    Read from the environment so that the main process is known before torch is imported.
    """
    env = os.environ if env is None else env
    for rank_key, size_key in (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE")):
        if env.get(size_key):
            return int(env.get(rank_key) or 0), int(env[size_key])
    return 0, 1


def is_main_process(env: dict[str, str] | None = None) -> bool:
    return process_layout(env)[0] == 0


def check_launch(env: dict[str, str] | None = None) -> None:
    """``accelerate launch --cpu --num_processes N`` starts ONE process (accelerate needs mpirun for
    several CPU processes) and sets MASTER_PORT without a world size: refuse instead of silently
    training alone."""
    env = os.environ if env is None else env
    if env.get("ACCELERATE_USE_CPU", "").lower() == "true" and env.get("MASTER_PORT") \
            and process_layout(env)[1] == 1:
        raise ArmorLabError("accelerate launch --cpu started a single process although several were asked "
                            "for; on CPU use `accelerate launch --multi_gpu --num_processes N -m armorlab "
                            "train ...` (gloo) or `torchrun --nproc_per_node N -m armorlab train ...`",
                            key="accelerate launch --cpu", value=env.get("ACCELERATE_USE_CPU"))


def job_id_from_env(env: dict[str, str] | None = None) -> str | None:
    """The Slurm job running this process, else the local executor's ``$ARMORLAB_JOB_ID``."""
    env = os.environ if env is None else env
    return slurm_job_id(env) or env.get("ARMORLAB_JOB_ID") or None


def read_stop_request(run_dir: RunDir) -> str | None:
    """The stop reason when ``stop_request`` exists (its JSON ``reason``, else its text), else None."""
    path = run_dir.path / STOP_REQUEST
    try:
        text = read_regular_text(path, limit=SMALL_FILE_BYTES).strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"stop requested ({exc.strerror})"
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return text or "stop requested"
    reason = data.get("reason") if isinstance(data, dict) else None
    return str(reason) if reason else "stop requested"


def complete_checkpoint(run_dir: RunDir) -> Path | None:
    """The newest checkpoint whose trainer_state.json (written last by transformers) parses."""
    for cp in reversed(run_dir.checkpoints()):
        try:
            json.loads(read_regular_text(cp / "trainer_state.json"))
        except (OSError, ValueError):
            log.warning("skipping incomplete checkpoint %s", cp)
            continue
        return cp
    return None


# how a full disk shows up when no OSError carries ENOSPC: torch's C++ writer ("file write failed",
# "basic_ios::clear: iostream error"), safetensors' Rust writer ("StorageFull", "code: 28")
_NO_SPACE_TEXT = ("no space left on device", "storagefull", "os error 28", "code: 28", "disk quota exceeded")
_WRITE_FAILED_TEXT = ("file write failed", "iostream error", "unexpected pos")
LOW_SPACE_BYTES = 64 * 1024 * 1024


def no_space_left(exc: BaseException, where: Path) -> bool:
    """Did ``exc`` come from a full disk (or an exhausted quota)? An OSError with ENOSPC/EDQUOT
    anywhere in its chain, a writer's message that says so, or a write failure while the file
    system of ``where`` has (almost) nothing free."""
    import errno
    import shutil

    chain, seen = [], set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    if any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in chain):
        return True
    text = " ".join(str(e).lower() for e in chain)
    if any(t in text for t in _NO_SPACE_TEXT):
        return True
    if any(t in text for t in _WRITE_FAILED_TEXT):
        try:
            return shutil.disk_usage(where).free < LOW_SPACE_BYTES
        except OSError:
            return False
    return False


def _in_checkpoint(exc: BaseException) -> bool:
    """Whether the traceback passes through transformers' checkpoint saving."""
    import traceback

    names = {f.name for f in traceback.extract_tb(exc.__traceback__)}
    return bool(names & {"_save_checkpoint", "save_model", "_save", "_save_optimizer_and_scheduler"})


def _remove_partial_checkpoints(run_dir: RunDir) -> None:
    """Checkpoints a full disk left half-written (no trainer_state.json: resume skips them anyway),
    removed to give the failure's status write room."""
    complete = complete_checkpoint(run_dir)
    for cp in run_dir.checkpoints():
        if complete is None or int(cp.name.split("-")[1]) > int(complete.name.split("-")[1]):
            remove_tree(cp, within=run_dir.path)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# --------------------------------------------------------------------------- process control
class StoppedBeforeSteps(BaseException):
    """A preemption signal before the first optimizer step (model build, warm start, loading): there
    is no step to finish, so the work stops at once. A BaseException, so that no ``except
    Exception`` on the way (a loader's error translation) takes it for a failure."""


class ProcessControl:
    """Signal flags and the stop-request check, turned into Trainer control at each step end; before
    the steps begin a signal stops the process at once (StoppedBeforeSteps)."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.signal: int | None = None
        self.preempted = False
        self.stop_reason: str | None = None
        self.stepping = False  # set by the Trainer's on_train_begin

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        self.signal = signum
        if not self.stepping:
            log.warning("received signal %d before the first step: stopping now", signum)
            raise StoppedBeforeSteps(signum)
        log.warning("received signal %d: checkpointing after the current step", signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[ProcessControl]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in PREEMPT_SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def callback(self) -> Any:
        from transformers import TrainerCallback

        control_ref = self

        class _Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                control_ref.stepping = True
                if control_ref.signal is not None:  # came while the trainer was being built
                    raise StoppedBeforeSteps(control_ref.signal)

            def on_step_end(self, args, state, control, **kwargs):
                control_ref.check(state, control)
                return control

        return _Callback()

    def check(self, state: Any, control: Any) -> None:
        flags = [self.signal is not None, read_stop_request(self.run_dir) is not None]
        flags = _any_process(flags)
        if flags[0]:
            self.preempted = True
            control.should_save = True
            control.should_training_stop = True
        elif flags[1]:
            self.stop_reason = read_stop_request(self.run_dir) or "stop requested"
            control.should_training_stop = True


def _any_process(flags: Sequence[bool]) -> list[bool]:
    """OR the flags over processes, so every rank stops (and checkpoints) at the same step."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(flags)
    import torch
    from accelerate import PartialState

    t = torch.tensor([float(f) for f in flags], device=PartialState().device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(x) for x in t.tolist()]


class HealthMonitor:
    """Keeps status.json's ``warnings`` up to date from the metrics as they are logged."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.rows: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        self.announced: set[str] = set()

    def callback(self) -> Any:
        from transformers import TrainerCallback

        from armorlab.train.telemetry import design_names

        monitor = self

        class _Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                if state.is_world_process_zero:  # a resumed run: the steps up to its checkpoint
                    monitor.rows = [r for r in monitor.run_dir.read_metrics() if r["step"] <= state.global_step]

            def on_log(self, args, state, control, logs=None, **kwargs):
                if state.is_world_process_zero and logs:
                    monitor.rows.append({"step": state.global_step, **design_names(logs)})
                    if len(monitor.rows) % 5 == 0:  # every check scans all rows: not on every log
                        monitor.update(final=False)

        return _Callback()

    def update(self, *, final: bool) -> list[str]:
        """The run's health warnings now (recorded in status.json). Mid-run a new one is logged at
        once; the final call logs none and returns them all, and ``unannounced`` says which of
        them the log has not shown yet (train prints those: each warning is shown once)."""
        from armorlab.core.health import run_warnings

        warnings = run_warnings(self.rows, final=final)
        if warnings != self.warnings:
            for w in warnings:
                if w not in self.warnings and not final:
                    log.warning("%s: %s", self.run_dir.path, w)
                    self.announced.add(w)
            self.warnings = warnings
            self.run_dir.set_warnings(warnings)
        return warnings

    def unannounced(self) -> tuple[str, ...]:
        return tuple(w for w in self.warnings if w not in self.announced)


def check_unchanged(stored: dict[str, Any], cfg: dict[str, Any], file: str) -> None:
    """The model and data a run dir was created for are still what its paths hold."""
    for section, what in (("model", "model"), ("task", "data")):
        before = (stored.get(section) or {}).get("fingerprint") if isinstance(stored.get(section), dict) else None
        after = cfg[section].get("fingerprint")
        if before != after:
            name = cfg[section].get("name" if section == "model" else "path")
            raise ArmorLabError(f"the {what} changed since this run was created (fingerprint {before} → "
                                f"{after}): train the config again for a new run", key=section,
                                value=name, file=file)


# --------------------------------------------------------------------------- building
def check_memory(cfg: dict[str, Any], file: str) -> None:
    """The memory plan (armorlab.core.memory_plan) of this process's share of the run on this GPU:
    ArmorLabError when it does not fit. The parallelism is what the launcher put in the environment;
    without CUDA nothing is refused."""
    import torch

    from armorlab.core.plan_inputs import memory_check_enabled, parallelism_from_env, plan_config

    if not torch.cuda.is_available() or not memory_check_enabled():
        return
    device = min(int(os.environ.get("LOCAL_RANK") or 0), torch.cuda.device_count() - 1)
    total = torch.cuda.get_device_properties(device).total_memory
    plan_config(cfg, parallelism_from_env(), total, file=file).check(file=file)


def make_args(cfg: dict[str, Any], run_dir: RunDir) -> Any:
    """ArmorLabConfig from a resolved config; TRL keys are checked against the real GRPOConfig."""
    import dataclasses

    import torch

    from armorlab.train.trainer_config import ArmorLabConfig

    ours, trl_kwargs = split_config(cfg)
    kwargs = {**trl_kwargs, **{k: v for k, v in ours.items() if k in FIELDS}}
    types = {f.name: f.type for f in dataclasses.fields(ArmorLabConfig)}
    file = str(run_dir.config_path)
    for key in sorted(kwargs):  # names were checked against the shipped list; TRL may differ here
        if key not in types:
            raise ArmorLabError("not a field of the installed GRPOConfig", key=key, value=kwargs[key], file=file)
    kwargs["output_dir"] = str(run_dir.checkpoints_dir)
    kwargs.update(continual_warmup_args(cfg))
    if not torch.cuda.is_available():
        kwargs.setdefault("use_cpu", True)
        kwargs.setdefault("bf16", False)
    try:
        return ArmorLabConfig(**kwargs)
    except ArmorLabError as exc:
        raise ArmorLabError(str(exc).split(" [")[0], key=exc.key, value=exc.value, file=file) from None
    except (TypeError, ValueError) as exc:
        raise ArmorLabError(f"GRPOConfig rejected the config: {exc}", file=file) from None


# Warnings that say nothing a user can act on, silenced where training starts. DDP's: transformers
# passes find_unused_parameters=True whenever gradient checkpointing is off, and torch then warns
# once per process that no parameter was unused (an extra traversal per step, not an error).
KNOWN_NOISE = (r"find_unused_parameters=True was specified in DDP constructor",)


def quiet_known_noise() -> None:
    import warnings

    for message in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=message)


def build_trainer(cfg: dict[str, Any], run_dir: RunDir, callbacks: Iterable[Any] = (),
                  start_from: str | os.PathLike | None = None, reference: Any = None) -> Any:
    """The trainer of a resolved config; ``start_from`` (a continuing run's selected parent
    checkpoint, init_from.find_start) replaces the config's model as the policy and π_ref;
    ``reference`` (init_from.find_reference, config ref_from) gives π_ref weights of its own."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from armorlab.tasks import build_task
    from armorlab.tasks.mathfile import build_eval_sets
    from armorlab.train import keep
    from armorlab.train.models import has_chat_template, prepare_model
    from armorlab.train.telemetry import RunDirLogger
    from armorlab.train.trainer import ArmorLabTrainer

    quiet_known_noise()
    args = make_args(cfg, run_dir)
    rows = _train_rows(cfg["task"])
    if rows is not None:  # before the model is built or loaded
        check_can_step(args, rows, str(run_dir.config_path))
    from accelerate import PartialState

    # the main process first: a tiny model built on another rank would not be saved (transformers'
    # save_pretrained writes on global rank 0 only once torch.distributed is up, as make_args left it)
    with PartialState().main_process_first():
        model = Path(start_from) if start_from is not None else prepare_model(cfg["model"], cfg["task"])
        ref_path = None if reference is None else \
            prepare_model(cfg["model"], cfg["task"]) if reference.source == "model" else reference.path
    task = build_task(cfg["task"], chat=has_chat_template(model))
    if cfg.get("overlong_buffer_len"):  # DAPO's soft overlong punishment, added to the task's reward
        from armorlab.tasks.rewards import OverlongPenalty

        task.reward_funcs = [*task.reward_funcs, OverlongPenalty(
            cfg["max_completion_length"], cfg["overlong_buffer_len"], cfg.get("overlong_penalty_factor", 1.0))]
    check_can_step(args, len(task.train), str(run_dir.config_path))
    held_out = build_eval_sets(cfg, task)  # refuses a set that shares problems with training
    data_metrics = {"data/dedup_dropped": float(task.settings["dedup_dropped"])} \
        if "dedup_dropped" in task.settings else {}
    try:
        trainer = ArmorLabTrainer(str(model), task.reward_funcs, args, train_dataset=task.train,
                                  val_dataset=task.val, test_dataset=task.test, tokens_dir=run_dir.tokens_dir,
                                  eval_sets=held_out, data_metrics=data_metrics,
                                  callbacks=[RunDirLogger(run_dir), *callbacks],
                                  reference_from=None if ref_path is None else str(ref_path))
    except ArmorLabError:
        raise
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RuntimeError) as exc:
        # transformers and TRL say what broke, not in which model: a user with several checkpoints needs both
        raise ArmorLabError(f"could not load the model and build its trainer: {type(exc).__name__}: {exc}",
                            key="model", value=str(model), file=str(run_dir.config_path)) from exc
    started = process_layout()[1]
    if trainer.accelerator.num_processes != started:
        # e.g. use_cpu: false on a machine without GPUs: accelerate then trains each process alone
        raise ArmorLabError(f"{started} processes were started but accelerate trains "
                            f"{trainer.accelerator.num_processes} together ({trainer.accelerator.distributed_type}); "
                            "without GPUs leave use_cpu unset (true)", key="use_cpu", value=args.use_cpu,
                            file=str(run_dir.config_path))
    keep.install(trainer, run_dir, trainer.args.keep_checkpoints)  # the kept checkpoints and selected.json
    _without_nulls_for_trackers(trainer)
    # keep the progress bar, drop transformers' printing of every log dict (metrics.jsonl has them)
    trainer.remove_callback(PrinterCallback)
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(_QuietProgress())
    return trainer


def _train_rows(task: dict[str, Any]) -> int | None:
    """The train split's size of a math task read from a file, known without building the task."""
    from armorlab.core.identity import data_rows

    if task["name"] != "math":
        return None
    rows = data_rows(task["path"])
    if rows is None:
        return None
    rest = max(0, rows - task["val_size"] - task["test_size"])
    return rest if task["train_size"] is None else min(rest, task["train_size"])


def check_can_step(args: Any, train_rows: int, file: str) -> None:
    """A run whose generation batch asks for more prompts than the train split holds takes no step
    at all (TRL's RepeatSampler drops an incomplete batch) and would end "completed" with nothing
    trained: an error naming the batch size instead."""
    prompts = args.generation_batch_size // args.num_generations
    if train_rows < prompts:
        raise ArmorLabError(
            f"a step samples {prompts} prompts ({args.generation_batch_size} rows of the generation batch / "
            f"num_generations {args.num_generations}; per_device_train_batch_size {args.per_device_train_batch_size} × "
            f"steps_per_generation {args.steps_per_generation} × {args.world_size} process(es)) but the train split "
            f"has {train_rows}: no step could be taken. Lower per_device_train_batch_size or steps_per_generation, "
            "or give more training rows", key="per_device_train_batch_size", value=args.per_device_train_batch_size,
            file=file)


def _without_nulls_for_trackers(trainer: Any) -> None:
    """report_to's trackers (TensorBoard, MLflow, ...) get each log without its null metrics: TRL
    logs None for a metric undefined over the whole step (e.g. a clip fraction with no token of
    that sign), and TensorBoard's callback warned about each one, about 9 lines a step. metrics.jsonl
    (RunDirLogger) still records them as null."""
    for callback in trainer.callback_handler.callbacks:
        if type(callback).__module__.startswith("transformers.integrations"):
            on_log = callback.on_log

            def filtered(args, state, control, logs=None, _on_log=on_log, **kwargs):
                logs = {k: v for k, v in (logs or {}).items() if v is not None}
                return _on_log(args, state, control, logs=logs, **kwargs)

            callback.on_log = filtered


def _close_progress(trainer: Any) -> None:
    """A run that died mid-training leaves its progress bar open (on_train_end never ran)."""
    for cb in getattr(getattr(trainer, "callback_handler", None), "callbacks", []):
        bar = getattr(cb, "training_bar", None)
        if bar is not None:
            bar.close()
            cb.training_bar = None


def _QuietProgress() -> Any:  # noqa: N802 - a factory standing in for a class defined lazily
    from transformers.trainer_callback import ProgressCallback

    class QuietProgress(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            return None

    return QuietProgress()


# --------------------------------------------------------------------------- entry points
def train_from_config(config: str | os.PathLike | None, overrides: Sequence[str] = (),
                      out: str | os.PathLike = "runs/train") -> Outcome:
    """Resolve CONFIG + overrides, create ``OUT/<run-id>/`` and train there (resuming if it exists)."""
    cfg = load_config(config, overrides)
    check_vllm_installed(cfg, str(config) if config is not None else "--set")
    from armorlab.core.runs import run_id

    run_dir = RunDir(Path(out) / run_id(cfg))
    changed = _changed_logging_keys(run_dir, cfg)
    if is_main_process():
        run_dir = RunDir.create(writable_dir(out, key="--out"), cfg)
    else:  # the main process creates it (and may still be writing config.yaml)
        _wait_for(run_dir.config_path)
    outcome = train_run_dir(run_dir.path)
    if outcome.already_completed and changed:
        import dataclasses

        outcome = dataclasses.replace(outcome, note=(
            f"only logging keys differ from that run ({', '.join(changed)}); they are not part of the run id, "
            "so this is the same run (config.yaml now has the new values)"))
    return outcome


def _changed_logging_keys(run_dir: RunDir, cfg: dict[str, Any]) -> list[str]:
    """The logging keys (config.LOGGING_KEYS) whose values differ from an existing run dir's config."""
    from armorlab.core.config import LOGGING_KEYS

    try:
        stored = run_dir.read_config() if run_dir.config_path.is_file() else None
    except ArmorLabError:
        return []
    if stored is None:
        return []
    return sorted(k for k in LOGGING_KEYS if stored.get(k) != cfg.get(k))



def _wait_for(path: Path, timeout_s: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise ArmorLabError("the main process did not create the run directory", key="run_dir",
                                value=str(path.parent))
        time.sleep(0.05)


def train_run_dir(path: str | os.PathLike, *, callbacks: Iterable[Any] = ()) -> Outcome:
    """Train the config stored in a run dir according to the process contract (module docstring)."""
    run_dir = RunDir(path)
    if not run_dir.config_path.is_file():
        raise ArmorLabError("not a run directory (no config.yaml)", key="--run-dir", value=str(path))
    check_launch()
    # transformers writes checkpoints/, and armorlab the rest, by path: a link planted in a shared run
    # dir would send those writes (and checkpoint deletions) elsewhere
    for entry in (run_dir.metrics_path, run_dir.status_path, run_dir.checkpoints_dir, run_dir.selected_path,
                  run_dir.tokens_dir, run_dir.report_dir):
        refuse_symlinks(entry, within=run_dir.path)
    # One owner per run dir: the training process holds its lock for life (rank 0 of a
    # multi-process launch speaks for all). A second trainer leaves everything untouched.
    rank0 = int(os.environ.get("RANK") or 0) == 0
    lock_fd = run_dir.acquire_owner() if rank0 else None
    if lock_fd is None and rank0:
        reason = (f"the run dir is owned by {describe_owner(run_dir.owner() or {})}, another live process: "
                  "not training it twice")
        log.error("%s: %s", run_dir.path, reason)
        return Outcome(run_dir.path, run_dir.read_status()["state"], reason, EXIT_BUSY)
    try:
        return _train_owned(run_dir, callbacks)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def _train_owned(run_dir: RunDir, callbacks: Iterable[Any]) -> Outcome:
    rank, world_size = process_layout()
    status = run_dir.read_status()
    if status["state"] in FINAL_STATES:
        log.info("%s is already %s; nothing to do", run_dir.path, status["state"])
        return Outcome(run_dir.path, status["state"], status.get("reason"), EXIT_OK, already_completed=True,
                       warnings=tuple(status.get("warnings") or ()))
    main = rank == 0

    def write_status(state: str, reason: str | None = None, *, any_process: bool = False, **kw: Any) -> None:
        # status.json is the main process's, except that a process failing on its own records why
        # (the main one may wait in a collective until the launcher kills it)
        if main:
            run_dir.write_status(state, reason=reason, **kw)
        elif any_process:
            run_dir.write_status(state, reason=f"process {rank}: {reason}", **kw)

    write_status("running", job_id=job_id_from_env(), world_size=world_size)
    control = ProcessControl(run_dir)
    health = HealthMonitor(run_dir)
    trainer = stopper = None
    try:
        with control.installed():
            stored = run_dir.read_config()
            # where this attempt's vLLM servers listen (a job of a profile with vllm_servers)
            cfg = resolve({**stored, **read_endpoints()}, file=str(run_dir.config_path))
            check_unchanged(stored, cfg, str(run_dir.config_path))
            start = find_start(run_dir, cfg["init_from"]) if cfg.get("init_from") else None
            checkpoint = complete_checkpoint(run_dir)
            parent_optimizer = start is not None and cfg["init_from"].get("optimizer") == "parent"
            if parent_optimizer and checkpoint is None:
                check_optimizer_state(start.checkpoint, str(run_dir.config_path))
            reference = find_reference(run_dir, cfg, None)
            check_vllm_installed(cfg, str(run_dir.config_path))
            check_memory(cfg, str(run_dir.config_path))  # before any model is loaded
            trainer = build_trainer(cfg, run_dir, [control.callback(), health.callback(), *callbacks],
                                    start_from=start.checkpoint if start else None, reference=reference)
            from armorlab.train import stopper as stopping

            stopper = stopping.install(trainer, run_dir, cfg)
            if checkpoint is not None:
                log.info("resuming %s from %s", run_dir.path, checkpoint.name)
            elif start is not None or reference is not None:  # the first step: record what it starts from
                record_start(trainer, run_dir, start, write=main, reference=reference)
                if parent_optimizer:
                    trainer.add_callback(parent_optimizer_callback(trainer, start.checkpoint))
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    except ArmorLabError as exc:
        write_status("failed", reason=str(exc))
        raise
    except StoppedBeforeSteps as stop:
        reason = f"preempted before the first step (signal {stop.args[0]})"
        write_status("pending", reason=reason)
        _close_progress(trainer)
        return Outcome(run_dir.path, "pending", reason, EXIT_PREEMPTED)
    except KeyboardInterrupt:
        step = trainer.state.global_step if trainer is not None else 0
        write_status("pending", reason=f"interrupted at step {step}")
        raise
    except Exception as exc:
        from armorlab.train.trainer import NonFiniteLossError

        if no_space_left(exc, run_dir.path):
            step = trainer.state.global_step if trainer is not None else 0
            where = "checkpoint at step" if _in_checkpoint(exc) else "at step"
            reason = f"no space left on device ({where} {step}): free space and run it again to resume"
            log.error("%s: %s (%s)", run_dir.path, reason, one_line(exc))
            _remove_partial_checkpoints(run_dir)
            write_status("failed", reason=reason, any_process=True)
            _close_progress(trainer)
            return Outcome(run_dir.path, "failed", reason, EXIT_NO_SPACE)
        if isinstance(exc, NonFiniteLossError):
            reason = str(exc)
        else:
            log.exception("training failed in %s", run_dir.path)
            reason = one_line(exc)
        write_status("failed", reason=reason, any_process=True)
        _close_progress(trainer)
        return Outcome(run_dir.path, "failed", reason, EXIT_FAILED)
    step = trainer.state.global_step
    if stopper is not None and stopper.stop is not None:  # final: the sweep does not restart it
        write_status("stopped", reason=stopper.stop.reason)
        return Outcome(run_dir.path, "stopped", stopper.stop.reason, EXIT_OK)
    if control.preempted and step < trainer.state.max_steps:
        reason = f"preempted at step {step}"
        write_status("pending", reason=reason)
        return Outcome(run_dir.path, "pending", reason, EXIT_PREEMPTED)
    if trainer.args.process_index == 0:
        health.update(final=True)
    warnings = health.unannounced() if trainer.args.process_index == 0 else ()
    reason = None if control.stop_reason is None else f"stopped at step {step}: {control.stop_reason}"
    write_status("completed", reason=reason)
    return Outcome(run_dir.path, "completed", reason, EXIT_OK, warnings=warnings)
