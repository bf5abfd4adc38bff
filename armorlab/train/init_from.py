"""Continual training: a run whose config names ``init_from`` starts from the checkpoint another
run selected, with π_ref initialised to it (the ARMOR paper's protocol: KL and ARMOR continue
from DAPO's best checkpoint, which is also their reference).

``init_from: {run: "<sweep>/<run-id>", select: {metric, mode}}`` names the parent relative to the
runs root (the child's sweep dir's parent). When the child starts (``find_start``):

1. a child that recorded its start (``init.json``) keeps it: a resumed run never re-selects;
2. else the parent must be completed; its ``selected.json`` (written by its trainer: the
   noise-aware validation-selected step and its kept checkpoint) gives the checkpoint when it
   selected by the metric and mode the child asks for;
3. else (no selected.json, or another metric) the step is computed from the parent's
   metrics.jsonl with the same rule (``armorlab.stats.select.select_checkpoints``), among the
   steps whose checkpoint is still there, and the log says so.

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
from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError

log = logging.getLogger(__name__)

SELECTED = "selected.json"
INIT = "init.json"
FROM_SELECTED, FROM_METRICS, FROM_INIT = "selected.json", "metrics.jsonl", "init.json"


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


def find_start(run_dir: RunDir, init_from: Mapping[str, Any]) -> Start:
    """The checkpoint a continuing run starts from (module docstring); ArmorLabError when there is none."""
    file = str(run_dir.config_path)
    recorded = _recorded(run_dir, init_from)
    if recorded is not None:
        return recorded
    parent = parent_run_dir(run_dir, init_from)
    if not parent.config_path.is_file():
        raise ArmorLabError(f"no run to continue from at {parent.path}", key="init_from.run",
                            value=init_from["run"], file=file)
    state = parent.read_status()
    if state["state"] != "completed":
        why = f": {state['reason']}" if state.get("reason") else ""
        raise ArmorLabError(f"the run to continue from is {state['state']}{why}; a continuation starts from "
                            "its final selection, once it has completed", key="init_from.run",
                            value=init_from["run"], file=file)
    select = init_from["select"]
    chosen = _from_selected(parent, init_from, file)
    if chosen is None:
        chosen = _from_metrics(parent, init_from, file)
        log.warning("%s has no selected.json selecting by %s (%s): computed from its metrics.jsonl: step %d, "
                    "level %.4g; %s", parent.path, select["metric"], select["mode"], chosen.step, chosen.value,
                    chosen.rule)
    if not loadable(chosen.checkpoint):
        raise ArmorLabError(f"the selected checkpoint {chosen.checkpoint} of the run to continue from is missing "
                            "or incomplete", key="init_from.run", value=init_from["run"], file=file)
    return chosen


def _recorded(run_dir: RunDir, init_from: Mapping[str, Any]) -> Start | None:
    try:
        data = json.loads(read_regular_text(run_dir.path / INIT, limit=SMALL_FILE_BYTES))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("run") != init_from["run"] or not isinstance(data.get("checkpoint"), str):
        return None
    checkpoint = Path(data["checkpoint"])
    if not loadable(checkpoint):
        raise ArmorLabError(f"this run started from {checkpoint} (its init.json), which is gone: it cannot resume "
                            "with the same π_ref", key="init_from.run", value=init_from["run"],
                            file=str(run_dir.path / INIT))
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


def _from_metrics(parent: RunDir, init_from: Mapping[str, Any], file: str) -> Start:
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
                            f"(checkpoints: {sorted(kept) or 'none'})", key="init_from.select.metric",
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


def record_start(trainer: Any, run_dir: RunDir, start: Start, *, write: bool) -> dict[str, Any] | None:
    """Hash what the policy and π_ref hold now (every process must call: the reference may be
    sharded and gathering it is a collective) and, where ``write``, save init.json atomically."""
    from armorlab.train.reference import full_state_dict

    policy = full_state_dict(trainer.model, cpu=True)  # gathered on the main process only
    reference = full_state_dict(trainer.reference.model, cpu=True)
    if not write:
        return None
    record = {"run": start.run, "step": start.step, "rollout": start.rollout, "checkpoint": str(start.checkpoint),
              "params_sha256": params_sha256(policy), "ref_params_sha256": params_sha256(reference),
              "source": start.source, "rule": start.rule, "value": start.value}
    atomic_write_json(run_dir.path / INIT, record)
    log.info("%s starts from %s step %d (%s)", run_dir.path, start.run, start.step, start.source)
    return record
