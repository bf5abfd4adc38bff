"""Cost of the gradient shares (``grad_share_every``: the loss's gradient with respect to the trained
tokens' log-probs, split into anchor / on-policy rows and the β·KL term), against the same training
without them.

    .venv/bin/python benchmarks/mechanism_overhead.py [--steps 24] [--rounds 3] [--wall]

Peer: the same ArmorLabTrainer with ``grad_share_every: 0`` — what a user runs when the probe is
off. Both are ARMOR with anchors, the gate and a β = 0.1 KL term (so both parts are taken), in the
demo's setting (the scratchpad task, 4 optimizer updates per rollout, one
micro-batch per update), at learning rate 0 so both generate the same completions (checked). The
two train in lockstep (``lockstep.py``: one optimizer step each in turn, sharing the machine's
spells); a sample is a generation cycle, the ratio the median over cycles of probe / peer.

Printed: the ratio with the probe on EVERY step (``grad_share_every: 1``, the worst case) and
with the default (``grad_share_every: 10``, the probe on one step in ten). The clock is the trainer
thread's CPU time (``--wall``: wall clock). A third trainer identical to the peer gives the noise
floor (``peer_vs_peer_ratio=``, truth 1). Because that floor is wider than the cost, the time
inside the shares' own calls (``ArmorLabTrainer._grad_shares``, same clock) is also summed and
divided by the every-step variant's total step time (``grad_share_time_frac_every_step=``; the
default's is a tenth of it). Target: ≤ 0.02 of a cycle.
Last line: ``grad_share_overhead_default=<x>``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of fresh trainers, each in lockstep")
    parser.add_argument("--wall", action="store_true", help="wall-clock instead of thread CPU time")
    opts = parser.parse_args()

    import torch
    import transformers
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from armorlab.core.config import resolve
    from armorlab.core.runs import RunDir
    from armorlab.tasks import build_task
    from armorlab.train.launch import make_args
    from armorlab.train.models import prepare_model
    from armorlab.train.telemetry import RunDirLogger
    from armorlab.train.trainer import ArmorLabTrainer

    sys.path.insert(0, str(Path(__file__).parent))
    import lockstep

    torch.set_num_threads(1)
    inside: dict[int, float] = {}  # trainer id → clock time inside _grad_shares
    timed = ArmorLabTrainer._grad_shares

    def timed_shares(self, *a, **kw):
        start = clock()
        try:
            return timed(self, *a, **kw)
        finally:
            inside[id(self)] = inside.get(id(self), 0.0) + clock() - start

    ArmorLabTrainer._grad_shares = timed_shares
    transformers.logging.set_verbosity_error()
    logging.getLogger("armorlab").setLevel(logging.WARNING)
    clock = time.perf_counter if opts.wall else time.thread_time
    work = Path(tempfile.mkdtemp(prefix="armorlab-bench-"))
    base = {"task": {"name": "scratchpad", "digits": 1, "operands": 3, "operators": "+-", "train_size": 256},
            "objective": "armor", "beta": 0.1, "ref_reset_steps": 0, "learning_rate": 0.0, "seed": 0,
            "max_steps": opts.steps, "per_device_train_batch_size": 16, "steps_per_generation": 4,
            "max_completion_length": 16, "val_every": 0, "kl_probe_prompts": 0, "save_steps": 10_000}
    cfg0 = resolve(base)
    model_path = str(prepare_model(cfg0["model"], cfg0["task"]))
    spg = cfg0["steps_per_generation"]

    def make(every: int):
        def build(out: Path):
            cfg = resolve({**base, "grad_share_every": every})
            rd = RunDir.create(out, cfg)
            args = make_args(cfg, rd)
            args.save_strategy, args.disable_tqdm = "no", True
            task = build_task(cfg["task"])
            trainer = ArmorLabTrainer(model_path, task.reward_funcs, args, train_dataset=task.train,
                                      tokens_dir=rd.tokens_dir, callbacks=[RunDirLogger(rd)])
            trainer.remove_callback(ProgressCallback)
            trainer.remove_callback(PrinterCallback)
            return trainer
        return build

    variants = {"probe off (peer)": make(0), "probe every step": make(1), "probe every 10 steps (default)": make(10),
                "probe off again": make(0)}
    names = list(variants)
    paired: dict[str, list[float]] = {n: [] for n in names}
    probed, share_time, every_step_time = 0, 0.0, 0.0
    for _ in range(opts.rounds):
        trainers, rng = {}, {}
        for i, (name, build) in enumerate(variants.items()):
            out = work / f"v{i}"
            shutil.rmtree(out, ignore_errors=True)
            trainers[name] = build(out)
            rng[name] = lockstep.rng_state()
        steps = lockstep.run_lockstep(trainers, clock, rng)
        lengths = {n: [h.get("trl/completions/mean_length", h.get("completions/mean_length")) for h in
                       t.state.log_history] for n, t in trainers.items()}
        if len({tuple(v) for v in lengths.values()}) != 1:
            raise SystemExit("the variants generated different completions: the pairing's premise fails")
        probed += sum("obj/anchor_grad_share" in h for h in trainers[names[1]].state.log_history)
        cycles = {n: lockstep.cycles(times, spg) for n, times in steps.items()}
        share_time += inside.pop(id(trainers[names[1]]), 0.0)
        every_step_time += sum(steps[names[1]])  # every step, as share_time
        for n in names:
            paired[n].extend(a / b for a, b in zip(cycles[n], cycles[names[0]], strict=True))
    if not probed:
        raise SystemExit("the probe never logged obj/anchor_grad_share: nothing was measured")
    unit = "wall" if opts.wall else "cpu"
    print(f"# gradient-share probe: {opts.rounds} rounds × {opts.steps} steps in lockstep, {unit} time per "
          f"generation cycle ({spg} steps); ratio = median over cycles of the variant's / the peer's "
          f"(grad_share_every 0) same cycle; ARMOR + anchors + gate + β = 0.1, scratchpad task, lr 0")
    ratios = {n: statistics.median(paired[n]) for n in names}
    for n in names:
        print(f"{n:32s} ratio {ratios[n]:.3f}  (cycles {len(paired[n])})")
    print(f"peer_vs_peer_ratio={ratios['probe off again']:.3f}")
    print(f"grad_share_time_frac_every_step={share_time / every_step_time:.4f}")
    print(f"grad_share_overhead_every_step={ratios['probe every step']:.3f}")
    print(f"grad_share_overhead_default={ratios['probe every 10 steps (default)']:.3f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
