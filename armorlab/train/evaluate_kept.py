"""``armorlab evaluate RUN_DIR``: score a run's kept checkpoints on its val and test splits, afterwards.

During training every validation already logs ``test/*`` at that step; this re-reads the kept
checkpoints (the selected one, the next best, the last) after the run — e.g. with more samples
per prompt for a tighter test estimate — without touching the training log. Each checkpoint is
loaded into the run's own trainer (transformers' checkpoint loader, any format it saved) and
scored by the trainer's Validator in the RNG stream of its step: with the run's ``val_samples``
the result equals what the run logged at that step. The result goes to ``evaluation.json`` in
the run dir (atomically).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from armorlab.core.config import resolve
from armorlab.core.fsutil import atomic_write_json
from armorlab.core.runs import RunDir
from armorlab.core.schedule import rollout_at
from armorlab.errors import ArmorLabError

log = logging.getLogger(__name__)

EVALUATION = "evaluation.json"


def evaluate_kept(path: str | os.PathLike, *, samples: int | None = None) -> dict[str, Any]:
    """Score every checkpoint in ``path``'s checkpoints/; write and return evaluation.json:
    ``{"samples": k, "checkpoints": [{"step", "rollout", "checkpoint", "selected", "val/acc", ...,
    "test/acc", "test/pass@k", "test/length", "test/n"}, ...]}``."""
    from armorlab.train.launch import build_trainer

    run_dir = RunDir(path)
    if not run_dir.config_path.is_file():
        raise ArmorLabError("not a run directory (no config.yaml)", key="RUN_DIR", value=str(path))
    owner = run_dir.owner()
    if owner is not None:
        raise ArmorLabError(f"the run is training (pid {owner.get('pid')} on {owner.get('host')}): its "
                            "checkpoints may be pruned meanwhile; evaluate it when it ends",
                            key="RUN_DIR", value=str(path))
    checkpoints = run_dir.checkpoints()
    if not checkpoints:
        raise ArmorLabError("the run has no checkpoints to evaluate", key="RUN_DIR", value=str(path))
    if samples is not None and samples < 1:
        raise ArmorLabError("must be ≥ 1", key="--samples", value=samples)
    cfg = resolve(run_dir.read_config(), file=str(run_dir.config_path))
    selected = run_dir.read_selected()
    trainer = build_trainer(cfg, run_dir)
    rows = []
    for cp in checkpoints:
        step = int(cp.name.rsplit("-", 1)[1])
        trainer._load_from_checkpoint(str(cp))  # transformers' loader: safetensors, shards, FSDP, ...
        scores = trainer.validator.scores(step, k=samples)
        name = f"checkpoints/{cp.name}"
        rows.append({"step": step, "rollout": rollout_at(step, trainer.per_rollout), "checkpoint": name,
                     "selected": bool(selected and selected["checkpoint"] == name), **scores})
        log.info("%s: %s", name, scores)
    record = {"samples": int(samples or trainer.args.val_samples), "checkpoints": rows}
    atomic_write_json(run_dir.path / EVALUATION, record)
    return record
