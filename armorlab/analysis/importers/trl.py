"""TRL output dirs: ``trainer_state.json`` of each checkpoint (and the top one), merged newest-first per
(metric, step); the config from transformers' TensorBoard ``args`` text where there is one
(docs/importers.md#trl-grpotrainer)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from armorlab.analysis.importers import flavours, tensorboard_events
from armorlab.analysis.importers.base import ImportedRun, flatten, read_source, rows_to_series
from armorlab.core.runs import valid_step

STATE = "trainer_state.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# trainer_state.json's own settings: the config when the run left no other record of it
STATE_SETTINGS = ("max_steps", "num_train_epochs", "train_batch_size", "logging_steps", "eval_steps",
                  "save_steps")


def state_files(out_dir: Path) -> list[Path]:
    """trainer_state.json files of an output dir: its checkpoints' and its own."""
    try:
        files = [p / STATE for p in out_dir.iterdir() if _CHECKPOINT.match(p.name) and (p / STATE).is_file()]
    except OSError:
        return []
    return files + [out_dir / STATE] if (out_dir / STATE).is_file() else files


def read(out_dir: Path, *, name: str | None = None) -> ImportedRun:
    out_dir = Path(out_dir)
    warnings, states = [], []  # states: (global_step, mtime, the state) per readable file, sorted below
    for f in state_files(out_dir):
        try:
            loaded = json.loads(read_source(f))
        except (OSError, ValueError, RecursionError) as exc:
            warnings.append(f"skipped unreadable {f}: {exc}")
            continue
        if not isinstance(loaded, dict) or not isinstance(loaded.get("log_history"), list):
            warnings.append(f"skipped {f}: no log_history list")
            continue
        step = loaded.get("global_step")
        states.append((step if isinstance(step, int) else 0, f.stat().st_mtime_ns, loaded))
    states = [loaded for *_, loaded in sorted(states, key=lambda t: t[:2])]
    series = rows_to_series((row["step"], row) for state in states for row in state["log_history"]
                            if isinstance(row, dict) and not flavours.TRL_SUMMARY & row.keys()
                            and valid_step(row.get("step")))
    # TrainingArguments as transformers' TensorBoard callback logged them, the newest attempt's first
    logdirs = sorted({p.parent for p in out_dir.glob("runs/*/events.out.tfevents.*")}, reverse=True)
    if logdirs and not tensorboard_events.available():
        warnings.append("the run's config is in its TensorBoard log: install armorlab[tensorboard] to read it")
        logdirs = []
    logged = (tensorboard_events.json_text(tensorboard_events.read_texts(d), ("args/text_summary", "args"))
              for d in logdirs)
    args = next((a for a in logged if a), {})
    last = states[-1] if states else {}
    settings = {k: last[k] for k in STATE_SETTINGS if last.get(k) is not None}
    flat = flatten({**settings, **args})
    control = (last.get("stateful_callbacks") or {}).get("TrainerControl", {}).get("args", {})
    step, max_steps = last.get("global_step"), last.get("max_steps")
    done = control.get("should_training_stop") or (isinstance(max_steps, int) and max_steps > 0
                                                    and isinstance(step, int) and step >= max_steps)
    state, reason = ("completed", None) if done else (
        "unknown", f"last checkpoint at step {step} of {max_steps}" if step is not None else "no checkpoint state")
    if not args:
        warnings.append("no training arguments recorded (seed unknown): give the seed in a runs.yaml mapping")
    return flavours.imported_run(series, flavours.TRL, flat, warnings, name=name or out_dir.name, path=out_dir,
                                 format="trl", project=out_dir.parent.name or None, state=state, reason=reason)
