"""Learning is real: dapo, up and armor raise val/acc of the warm-started tiny model.

    .venv/bin/python benchmarks/learning.py [--steps 200] [--val-every 20] [--set key=value ...]

Each objective trains the default config (the cached warm-started tiny model, 2-digit addition)
for ``--steps`` steps through the real entry point (``armorlab.train.launch.train_run_dir``) and
validates every ``--val-every`` steps (avg@4 at temperature 1 on 64 held-out prompts, and the
test split). Printed per objective: val/acc and test/acc at step 0 (the base model), at the last
step, and the mean of the last three evaluations (less noisy than one), plus train/reward over
the first and last 20 steps and the wall time. Last line: ``learned=<n>/3`` — objectives whose
mean of the last three val/acc exceeds the base model's val/acc.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

OBJECTIVES = ("dapo", "up", "armor")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--val-every", type=int, default=20)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra key=value")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run dirs under this root")
    opts = parser.parse_args()

    import logging

    import torch
    import transformers

    from armorlab.core.config import load_config
    from armorlab.core.runs import RunDir
    from armorlab.train.launch import train_run_dir

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    logging.getLogger("armorlab").setLevel(logging.WARNING)
    root = opts.keep or Path(tempfile.mkdtemp(prefix="armorlab-learning-"))
    learned = 0
    print(f"learning: {opts.steps} steps, val every {opts.val_every}; val/acc = avg@4 at T=1 on held-out prompts")
    for objective in OBJECTIVES:
        cfg = load_config(None, [f"objective={objective}", f"max_steps={opts.steps}",
                                 f"val_every={opts.val_every}", "save_steps=100000", *opts.overrides])
        run_dir = RunDir.create(root / objective, cfg)
        start = time.perf_counter()
        outcome = train_run_dir(run_dir.path)
        seconds = time.perf_counter() - start
        if outcome.exit_code:
            print(f"  {objective:6s} {outcome.state}: {outcome.reason}")
            continue
        rows = run_dir.read_metrics()
        evals = [r for r in rows if r.get("val/acc") is not None]
        rewards = [r["train/reward"] for r in rows if r.get("train/reward") is not None]
        base, last = evals[0], evals[-1]
        tail = evals[-3:]
        val_tail = sum(r["val/acc"] for r in tail) / len(tail)
        test_tail = sum(r["test/acc"] for r in tail) / len(tail)
        learned += val_tail > base["val/acc"]
        print(f"  {objective:6s} val/acc {base['val/acc']:.3f} → {last['val/acc']:.3f} "
              f"(last-3 mean {val_tail:.3f})   test/acc {base['test/acc']:.3f} → {last['test/acc']:.3f} "
              f"(last-3 mean {test_tail:.3f})   train/reward {_mean(rewards[:20]):.3f} → "
              f"{_mean(rewards[-20:]):.3f}   {seconds:.0f}s")
    if opts.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    print(f"learned={learned}/{len(OBJECTIVES)}")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


if __name__ == "__main__":
    main()
