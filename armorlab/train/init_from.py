"""Continual training: a run whose config names ``init_from`` starts from the checkpoint another
run selected, with π_ref initialised to it (the ARMOR paper's protocol: KL and ARMOR continue
from DAPO's best checkpoint, which is also their reference).

``init_from: {run: "<sweep>/<run-id>", select: ..., optimizer: fresh|parent, warmup: N}`` names the
parent relative to the runs root (the child's sweep dir's parent). ``select`` is the metric's
noise-aware max/min (``{metric, mode}``), a given checkpoint (``{step: N}``, ``{rollout: N}``: the
step that ends rollout N) or the last complete one (``{mode: last}``). When the child starts
(``find_start``):

1. a child that recorded its start (``init.json``) keeps it: a resumed run never re-selects;
2. else the parent must be completed; its ``selected.json`` (written by its trainer: the
   noise-aware validation-selected step and its kept checkpoint) gives the checkpoint when it
   selected by the metric and mode the child asks for;
3. else (no selected.json, or another metric) the step is computed from the parent's
   metrics.jsonl with the same rule (``armorlab.stats.select.select_checkpoints``), among the
   steps whose checkpoint is still there, and the log says so; a given step or rollout, or the
   last, is that checkpoint, which must still be there.

``optimizer: parent`` needs the checkpoint's optimizer and scheduler state (``check_optimizer_state``;
the trainer loads them in place of its fresh ones); ``fresh`` gets a linear LR warm-up
(``config.continual_warmup``). ``ref_from`` (a run and a selection: the same rule, recorded in
``ref_from.json``; the config's model; or a checkpoint path) gives π_ref apart from the policy
(``find_reference``).

The checkpoint directory is then the model path the trainer loads the policy AND π_ref from
(launch.build_trainer), and ``record_start`` writes ``init.json`` in the child's run dir:
``{"run", "step", "rollout", "checkpoint", "params_sha256", "ref_params_sha256", "source",
"rule", "value"}`` — the hashes of the weights the policy and π_ref hold before the first step.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from armorlab.core.fsutil import SMALL_FILE_BYTES, atomic_write_json, read_regular_text
from armorlab.core.runs import FINAL_STATES, RunDir
from armorlab.errors import ArmorLabError

log = logging.getLogger(__name__)

SELECTED = "selected.json"
INIT = "init.json"
REF = "ref_from.json"
FROM_SELECTED, FROM_METRICS, FROM_INIT = "selected.json", "metrics.jsonl", "init.json"
FROM_CHECKPOINTS = "checkpoints"
# what an HF Trainer checkpoint holds of the optimizer and LR scheduler (plain, FSDP, DeepSpeed)
OPTIMIZER_FILES = ("optimizer.pt", "optimizer.bin", "optimizer_0")
SCHEDULER_FILE = "scheduler.pt"


@dataclass(frozen=True)
class Start:
    """Where a continuing run starts: the parent (``<sweep>/<run-id>``), the selected step and
    its checkpoint directory (absolute), and how it was found (``source``)."""
    run: str
    step: int
    rollout: int | None
    checkpoint: Path
    source: str
    rule: str | None = None
    value: float | None = None


def parent_run_dir(run_dir: RunDir, init_from: Mapping[str, Any]) -> RunDir:
    """The run ``init_from.run`` names: ``<sweep>/<run-id>`` under the child's runs root."""
    return RunDir(run_dir.path.parent.parent / init_from["run"])


def loadable(checkpoint: Path) -> bool:
    """A complete checkpoint: weights config and trainer state written (the state is written last)."""
    try:
        json.loads(read_regular_text(checkpoint / "trainer_state.json"))
    except (OSError, ValueError):
        return False
    return (checkpoint / "config.json").is_file()


def _step_of(checkpoint: Path) -> int | None:
    head, _, tail = checkpoint.name.rpartition("-")
    return int(tail) if head == "checkpoint" and tail.isdigit() else None


def find_start(run_dir: RunDir, init_from: Mapping[str, Any], *, key: str = "init_from",
               record: str = INIT) -> Start:
    """The checkpoint a continuing run starts from (module docstring); ArmorLabError when there is none.
    ``key`` and ``record`` serve ``ref_from`` (the same rule, its own record)."""
    file = str(run_dir.config_path)
    recorded = _recorded(run_dir, init_from, record, key)
    if recorded is not None:
        return recorded
    parent = parent_run_dir(run_dir, init_from)
    if not parent.config_path.is_file():
        raise ArmorLabError(f"no run to continue from at {parent.path}", key=f"{key}.run",
                            value=init_from["run"], file=file)
    state = parent.read_status()
    if state["state"] not in FINAL_STATES:  # a stopped run's selection is final too
        why = f": {state['reason']}" if state.get("reason") else ""
        raise ArmorLabError(f"the run to continue from is {state['state']}{why}; a continuation starts from "
                            "its final selection, once it has completed", key=f"{key}.run",
                            value=init_from["run"], file=file)
    select = init_from["select"]
    if "metric" not in select:
        chosen = _given(parent, init_from, key, file)
    else:
        chosen = _from_selected(parent, init_from, file)
        if chosen is None:
            chosen = _from_metrics(parent, init_from, file, key)
            log.warning("%s has no selected.json selecting by %s (%s): computed from its metrics.jsonl: step %d, "
                        "level %.4g; %s", parent.path, select["metric"], select["mode"], chosen.step, chosen.value,
                        chosen.rule)
    if not loadable(chosen.checkpoint):
        raise ArmorLabError(f"the selected checkpoint {chosen.checkpoint} of the run to continue from is missing "
                            "or incomplete", key=f"{key}.run", value=init_from["run"], file=file)
    return chosen


def _given(parent: RunDir, spec: Mapping[str, Any], key: str, file: str) -> Start:
    """A selection by ``step``, ``rollout`` or ``last``: that checkpoint of the parent."""
    select = spec["select"]
    kept = {s: cp for cp in parent.checkpoints() if (s := _step_of(cp)) is not None and loadable(cp)}
    rows = parent.read_metrics()
    rollouts = {r["step"]: r.get("rollout") for r in rows if isinstance(r.get("step"), int)}
    if "step" in select:
        step, said = select["step"], f"step {select['step']}"
    elif "rollout" in select:
        ends = [s for s, r in rollouts.items() if r == select["rollout"]]
        step, said = (max(ends) if ends else None), f"the last step of rollout {select['rollout']}"
    else:
        step, said = (max(kept) if kept else None), "the last complete checkpoint"
    if step not in kept:
        which = "select.rollout" if "rollout" in select else "select.step" if "step" in select else "select.mode"
        raise ArmorLabError(f"the run to continue from has no complete checkpoint at {said}"
                            + (f" (step {step})" if step is not None and "rollout" in select else "")
                            + f"; its checkpoints: {sorted(kept) or 'none'}", key=f"{key}.{which}",
                            value=next(iter(select.values())), file=file)
    rollout = rollouts.get(step)
    return Start(spec["run"], int(step), rollout if isinstance(rollout, int) else None, kept[step].absolute(),
                 FROM_CHECKPOINTS, f"given: {said}", None)


def check_optimizer_state(checkpoint: Path, file: str) -> None:
    """``init_from.optimizer: parent`` restores Adam's moments and the LR scheduler from the
    checkpoint: both must be there (a kept checkpoint saved with save_only_model has neither)."""
    missing = [what for what, there in (
        ("optimizer state (" + " or ".join(OPTIMIZER_FILES) + ")",
         any((checkpoint / name).exists() for name in OPTIMIZER_FILES)),
        (f"scheduler state ({SCHEDULER_FILE})", (checkpoint / SCHEDULER_FILE).is_file())) if not there]
    if missing:
        raise ArmorLabError(f"the checkpoint {checkpoint} holds no {' and no '.join(missing)}: it cannot restore "
                            "the parent's optimizer; use optimizer: fresh (with its warm-up)",
                            key="init_from.optimizer", value="parent", file=file)


# lr_scheduler_type → the one that adds warmup_steps to it (the others read warmup_steps themselves)
WITH_WARMUP = {"constant": "constant_with_warmup"}


def continual_warmup_args(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The GRPOConfig keys that give a continuation's fresh optimizer its linear LR warm-up
    (``config.continual_warmup``): none where the config warms up on its own (warmup_steps or
    warmup_ratio) or nothing is warmed up (no init_from, optimizer: parent, warmup: 0)."""
    from armorlab.core.config import continual_warmup

    steps = continual_warmup(cfg.get("init_from"))
    if not steps or cfg.get("warmup_steps") or cfg.get("warmup_ratio"):
        return {}
    kind = cfg.get("lr_scheduler_type", "linear")
    return {"warmup_steps": steps, "lr_scheduler_type": WITH_WARMUP.get(kind, kind)}


def parent_optimizer_callback(trainer: Any, checkpoint: Path) -> Any:
    """A callback loading ``checkpoint``'s optimizer and scheduler state into the trainer's when
    training begins (after the trainer has built and wrapped them; HF's own loader, so plain and
    FSDP checkpoints load as a resume would load them) — at step 0 only: a resumed run has its own."""
    from transformers import TrainerCallback

    class ParentOptimizer(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 0:
                trainer._load_optimizer_and_scheduler(str(checkpoint))
                log.info("optimizer and LR scheduler restored from %s", checkpoint)

    return ParentOptimizer()


@dataclass(frozen=True)
class Reference:
    """Where π_ref starts when ``ref_from`` sets it apart from the policy: a directory (or hub id)
    and, for a run's selection, that selection (``start``)."""
    path: Path | str
    source: str
    start: Start | None = None


def find_reference(run_dir: RunDir, cfg: Mapping[str, Any], model_path: Path | str | None) -> Reference | None:
    """π_ref's start for ``ref_from`` (module docstring); None = the policy's start. ``model_path``
    is the config's model as the trainer loads it (ref_from: model)."""
    ref = cfg.get("ref_from")
    if ref is None:
        return None
    if ref == "model":
        return Reference(model_path, "model")
    if "checkpoint" in ref:
        return Reference(Path(ref["checkpoint"]), "checkpoint")
    start = find_start(run_dir, ref, key="ref_from", record=REF)
    return Reference(start.checkpoint, "run", start)


def _recorded(run_dir: RunDir, init_from: Mapping[str, Any], record: str = INIT,
              key: str = "init_from") -> Start | None:
    try:
        data = json.loads(read_regular_text(run_dir.path / record, limit=SMALL_FILE_BYTES))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("run") != init_from["run"] or not isinstance(data.get("checkpoint"), str):
        return None
    checkpoint = Path(data["checkpoint"])
    if not loadable(checkpoint):
        raise ArmorLabError(f"this run started from {checkpoint} (its {record}), which is gone: it cannot resume "
                            "with the same π_ref", key=f"{key}.run", value=init_from["run"],
                            file=str(run_dir.path / record))
    return Start(data["run"], int(data["step"]), data.get("rollout"), checkpoint, data.get("source") or FROM_INIT,
                 data.get("rule"), data.get("value"))


def _from_selected(parent: RunDir, init_from: Mapping[str, Any], file: str) -> Start | None:
    path = parent.path / SELECTED
    try:
        sel = json.loads(read_regular_text(path, limit=SMALL_FILE_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ArmorLabError(f"unreadable selected.json of the run to continue from: {exc}", file=str(path)) from None
    want = init_from["select"]
    if not isinstance(sel, dict) or (sel.get("metric"), sel.get("mode")) != (want["metric"], want["mode"]):
        return None  # selected by another rule: compute the one this run asks for
    if not isinstance(sel.get("step"), int) or not isinstance(sel.get("checkpoint"), str):
        raise ArmorLabError("selected.json lacks its step or checkpoint", key="step", value=sel.get("step"),
                            file=str(path))
    checkpoint = (parent.path / sel["checkpoint"]).absolute()
    own = parent.checkpoints_dir / f"checkpoint-{sel['step']}"
    if os.path.realpath(checkpoint) != os.path.realpath(own) or checkpoint.is_symlink():
        raise ArmorLabError(f"selected.json must name its own run's checkpoint of the selected step ({own.relative_to(parent.path)}): "
                            "a checkpoint elsewhere would start this run from another run's weights",
                            key="checkpoint", value=sel["checkpoint"], file=str(path))
    rollout = sel.get("rollout")
    return Start(init_from["run"], sel["step"], rollout if isinstance(rollout, int) else None,
                 checkpoint, FROM_SELECTED, sel.get("rule"), sel.get("value"))


def _from_metrics(parent: RunDir, init_from: Mapping[str, Any], file: str, key: str = "init_from") -> Start:
    # lazy: numpy, for the one case without selected.json (a trainer start must not pay for it)
    from armorlab.stats.select import level_rule, select_checkpoints

    metric, mode = init_from["select"]["metric"], init_from["select"]["mode"]
    rows = parent.read_metrics()
    curve = [(r["step"], r[metric]) for r in rows if isinstance(r.get(metric), (int, float))
             and not isinstance(r.get(metric), bool)]
    kept = {s: cp for cp in parent.checkpoints() if (s := _step_of(cp)) is not None and loadable(cp)}
    picks = select_checkpoints([s for s, _ in curve], [v for _, v in curve], eligible=kept, mode=mode)
    if not picks:
        raise ArmorLabError(f"the run to continue from logged no {metric} at a step whose checkpoint it kept "
                            f"(checkpoints: {sorted(kept) or 'none'})", key=f"{key}.select.metric",
                            value=metric, file=file)
    step = int(picks[0].step)
    rollout = next((r.get("rollout") for r in rows if r["step"] == step), None)
    rule = f"{level_rule(metric=metric, mode=mode)} (over steps {', '.join(map(str, picks[0].window))})"
    return Start(init_from["run"], step, rollout if isinstance(rollout, int) else None, kept[step].absolute(),
                 FROM_METRICS, rule, picks[0].level)


# --------------------------------------------------------------------------- the start as trained
def params_sha256(state: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> str:
    """sha256 over the tensors of a state dict in name order: each name, dtype, shape and raw bytes.
    The same weights give the same hash whatever device, wrapping or file they came from."""
    import torch

    items = state.items() if isinstance(state, Mapping) else state
    h = hashlib.sha256()
    for name, tensor in sorted(items, key=lambda kv: kv[0]):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def record_start(trainer: Any, run_dir: RunDir, start: Start | None, *, write: bool,
                 reference: Reference | None = None) -> dict[str, Any] | None:
    """Hash what the policy and π_ref hold now (every process must call: the reference may be
    sharded and gathering it is a collective) and, where ``write``, save init.json atomically
    (and ref_from.json for a reference selected from a run)."""
    from armorlab.train.reference import full_state_dict

    policy = full_state_dict(trainer.model, cpu=True)  # gathered on the main process only
    ref_model = trainer.reference.model
    ref_state = full_state_dict(ref_model, cpu=True) if ref_model is not None else None
    if not write:
        return None
    ref_sha = params_sha256(ref_state) if ref_state is not None else None
    if reference is not None and reference.start is not None:
        atomic_write_json(run_dir.path / REF, {**_start_record(reference.start), "ref_params_sha256": ref_sha})
    if start is None:
        return None
    record = {**_start_record(start), "params_sha256": params_sha256(policy), "ref_params_sha256": ref_sha,
              "ref_from": getattr(trainer, "reference_from", None)}
    atomic_write_json(run_dir.path / INIT, record)
    log.info("%s starts from %s step %d (%s)", run_dir.path, start.run, start.step, start.source)
    return record


def _start_record(start: Start) -> dict[str, Any]:
    return {"run": start.run, "step": start.step, "rollout": start.rollout, "checkpoint": str(start.checkpoint),
            "source": start.source, "rule": start.rule, "value": start.value}
