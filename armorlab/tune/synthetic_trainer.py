"""A stand-in trainer with a known optimum, for testing searches without training a model.

``python -m armorlab.tune.synthetic_trainer --run-dir DIR`` honours the trainer's process contract (C3):
owner.lock held for life (exit 73 when another process owns the run dir), status.json running →
completed/failed/pending, metrics.jsonl rows (``train/reward`` every step,
``val/acc`` and ``test/acc`` at step 0 and every ``val_every`` steps), a resume that continues
after the last logged step, ``stop_request`` → "stopped at step N: <reason>" exit 0, SIGTERM or
SIGUSR1 → "preempted at step N" exit 75, and "non-finite loss at step N" exit 1.

The curves are a closed-form function of the config, so a search's right answer is known:
quality q = exp(−Σ ((x − x*)/w)²) over the keys below; val/acc(step) = q·(1 − e^(−step/20)); a
learning rate above ``COLLAPSE_LR`` makes val/acc collapse after 30 % of the run (while the
train reward keeps rising: the over-optimisation signature), and one at or above
``DIVERGE_LR`` ends in a non-finite loss half-way. The tune tests select it through the sweep
layer's stand-in hook, ``ARMORLAB_TRAIN_COMMAND='["python", "-m", "armorlab.tune.synthetic_trainer"]'``
(armorlab.sweeps.jobs.train_argv); it never imports torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

from armorlab.core.exits import EXIT_BUSY, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from armorlab.core.runs import RunDir

# (optimum, width); learning_rate is compared on a log10 scale
OPTIMUM: dict[str, tuple[float, float]] = {
    "alpha": (0.7, 0.2),
    "ref_reset_steps": (80.0, 60.0),
    "epsilon_high": (0.3, 0.1),
    "learning_rate": (-4.0, 1.0),
}
COLLAPSE_LR = 3e-4
DIVERGE_LR = 5e-3
STEP_S_ENV = "ARMORLAB_SYNTHETIC_STEP_S"


def quality(cfg: Mapping[str, Any]) -> float:
    total = 0.0
    for key, (best, width) in OPTIMUM.items():
        value = cfg.get(key)
        if value is None:
            continue
        x = math.log10(value) if key == "learning_rate" else float(value)
        total += ((x - best) / width) ** 2
    return math.exp(-total)


def _noise(seed: int, step: int, what: str) -> float:
    """Deterministic noise in [−0.005, 0.005] from (seed, step)."""
    h = hashlib.sha256(f"{seed}:{step}:{what}".encode()).digest()
    return (int.from_bytes(h[:4], "big") / 2**32 - 0.5) * 0.01


def val_acc(cfg: Mapping[str, Any], step: int) -> float:
    q = quality(cfg)
    acc = q * (1.0 - math.exp(-step / 20.0))
    collapse_at = 0.3 * cfg["max_steps"]
    if cfg.get("learning_rate", 0) > COLLAPSE_LR and step > collapse_at:
        acc *= math.exp(-(step - collapse_at) / 10.0)
    return min(1.0, max(0.0, acc + _noise(cfg.get("seed", 0), step, "val")))


def _rows(cfg: Mapping[str, Any], step: int) -> dict[str, float]:
    row = {"train/reward": quality(cfg) * (1.0 - math.exp(-step / 15.0))}
    every = cfg.get("val_every") or 0
    if every and (step % every == 0 or step == cfg["max_steps"]):
        acc = val_acc(cfg, step)
        row["val/acc"] = acc
        row["test/acc"] = max(0.0, acc - 0.02 + _noise(cfg.get("seed", 0), step, "test"))
    return row


def train(run_dir: str) -> int:
    rd = RunDir(run_dir)
    lock = rd.acquire_owner()  # contract: one trainer per run dir, the lock held until exit
    if lock is None:
        print(f"another live process owns {rd.path}", file=sys.stderr)
        return EXIT_BUSY
    try:
        return _train(rd)
    finally:
        os.close(lock)


def _train(rd: RunDir) -> int:
    cfg = rd.read_config()
    job = (f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
           if os.environ.get("SLURM_ARRAY_JOB_ID") else os.environ.get("SLURM_JOB_ID")) \
        or os.environ.get("ARMORLAB_JOB_ID")
    rd.write_status("running", job_id=job)
    stop = {"signal": False}

    def on_signal(*_: object) -> None:
        stop["signal"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    step_s = float(os.environ.get(STEP_S_ENV, "0.01"))
    last = rd.last_step()
    start = 0 if last is None else last + 1
    max_steps = int(cfg["max_steps"])
    diverge_at = max_steps // 2 if cfg.get("learning_rate", 0) >= DIVERGE_LR else None
    for step in range(start, max_steps + 1):
        time.sleep(step_s)
        if diverge_at is not None and step >= diverge_at:
            rd.write_status("failed", reason=f"non-finite loss at step {step}")
            return EXIT_FAILED
        rd.append_metrics(step, _rows(cfg, step))
        stop_path = rd.path / "stop_request"
        if stop_path.exists() and step < max_steps:
            try:
                reason = json.loads(stop_path.read_text()).get("reason", "stop requested")
            except (OSError, ValueError):
                reason = "stop requested"
            rd.write_status("completed", reason=f"stopped at step {step}: {reason}")
            return EXIT_OK
        if stop["signal"] and step < max_steps:
            rd.write_status("pending", reason=f"preempted at step {step}")
            return EXIT_PREEMPTED
    rd.write_status("completed")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m armorlab.tune.synthetic_trainer")
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args(argv)
    return train(args.run_dir)


if __name__ == "__main__":
    sys.exit(main())
