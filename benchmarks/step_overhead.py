"""Step-time overhead of ArmorLabTrainer over stock TRL, and the anchor-rollout cost with/without cache.

    .venv/bin/python benchmarks/step_overhead.py [--steps 48] [--rounds 4] [--no-control] [--wall]

Part 1: the peer a user would pick instead, stock ``GRPOTrainer(loss_type="dapo", beta=0)`` (no
reference model at all), against ``ArmorLabTrainer`` with objective dapo and up (targets ≤ 1.03:
at β = 0 without anchors π_ref only scores one micro-batch of 1 generation in 8, for
``kl/reverse_*``), the same with the paper base's telemetry (``token_sample_rate: 0.001``, ≤ 1.03),
armor without anchors (≤ 1.20: r_mix needs π_ref's forward on every row) and armor with anchors and
the gate (≤ 1.35 on the tiny model: also the reference draws, one call of k per prompt), on the same
tiny model, batch, task and seed, at learning rate 0 (identical completions everywhere, checked
after each round — except with anchors, whose reference draws move the generation RNG). The
variants train in lockstep (``lockstep.py``: each in its own thread, one optimizer step each in
turn), so every step of one falls within a fraction of a second of the same step of the others
and they share the machine's fast and slow spells, which last seconds. A sample is a generation
cycle (``steps_per_generation`` steps: one generation and its updates, their logging included;
the first cycle warms up and is dropped); a variant's ratio is the median over cycles of its
cycle / stock's same cycle, over ``--rounds`` rounds of fresh trainers × ``--steps`` steps. The
ArmorLab side writes its metrics.jsonl (a real run's cost). A second stock trainer runs beside
the first (``--no-control`` drops it): ``stock_vs_stock_ratio=`` is the same statistic where the
truth is 1, the noise floor. Each variant's cycle is split into policy generation (TRL's
``_generate_single_turn``), reference draws (the anchor sampler), the reference forward
(``_add_reference_logps``: π_ref's log-probs of the generation batch), scoring (the rest of
``_generate_and_score_completions``: rewards, anchors' bookkeeping, forward KL; stock's π_old
forward of every row) and training (the rest of the cycle: the optimizer steps and their telemetry;
armorlab's π_old forward, of the micro-batches after the first only, runs after TRL's split and
lands here). For the two armor
variants ``..._beyond_reference_ratio=`` is the same statistic on each cycle less its reference
forward and draws: what ARMOR costs beyond the π_ref work its objective reads (truth ≈ 1 when
nothing else is added).
(Stock with β = 0.001, the former peer, computes reference log-probs on every row too: against
it the armorlab side read ≈ 1.0, hiding the reference forward a β = 0 user does not pay.)

The clock is the trainer thread's CPU time (``time.thread_time``) with one intra-op thread, so
time the scheduler gives other processes on a shared machine is not counted; ``--wall`` uses
wall-clock time (only one trainer computes at a time).

Part 2: anchor rollout (ARMOR, gate on) on a train set of exactly one generation batch of
prompts, so each recurs 4× per reference window (τ = 4 generations): reference samples per
step and cycle time with the per-window cache and with it disabled (run one after the other).

Part 3: the forward-KL estimate (``kl/forward_*`` on the unconditioned first reference draws
behind the anchors of ``ArmorLabTrainer.forward_kl_share`` of the generations) against the same
ARMOR run with it off (``forward_kl_share = 0``), anchors and gate on, learning rate 0, in
lockstep; ``forward_kl_overhead=`` is the median over cycles of on's cycle / off's. Target ≤ 1.10.

Part 4: part 1 again in 2 processes (torchrun, gloo; each process its own batch of the default
size): stock TRL in 2 processes against ArmorLabTrainer in 2 processes, the main process's clock;
``overhead_2proc_max=<x>``.

``--parts 3`` runs only part 3. Last line: ``overhead_max=<x>`` (the larger of armorlab dapo's and
up's part-1 ratios, one process) when part 1 runs, else ``forward_kl_overhead=<x>``.
"""

from __future__ import annotations

import argparse
import os
import re
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
    parser.add_argument("--steps", type=int, default=48, help="optimizer steps per round")
    # lockstep: 4 rounds × 48 steps (88 paired cycles) put stock against itself at 0.987-1.012
    # in four runs; the former design (variants one after another, 10 rounds × 24 steps) scattered
    # 0.86-1.27 over runs on the same machine, whose speed drifts by a third within seconds
    parser.add_argument("--rounds", type=int, default=4, help="rounds of fresh trainers, each in lockstep")
    parser.add_argument("--control", action=argparse.BooleanOptionalAction, default=True,
                        help="also time stock against itself (known ratio 1): the statistic's noise floor")
    parser.add_argument("--wall", action="store_true", help="wall-clock instead of thread CPU time")
    parser.add_argument("--parts", default="1,2,3,4", help="which parts to run, e.g. 3 or 1,3")
    parser.add_argument("--variants", help="part 1's variants beside the peer (and its control), by their line "
                        "names, e.g. armorlab_armor_anchors_gate: a shorter run for one figure")
    parser.add_argument("--part1-in", metavar="WORK", help=argparse.SUPPRESS)  # part 4's processes
    opts = parser.parse_args()
    distributed = opts.part1_in is not None
    if distributed:
        opts.parts = "1"

    import logging

    import torch
    import transformers
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl import __version__ as trl_version

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
    transformers.logging.set_verbosity_error()
    logging.getLogger("armorlab").setLevel(logging.WARNING)
    clock = time.perf_counter if opts.wall else time.thread_time
    # part 4: each process its own output dirs (a run dir's files are the main process's)
    work = Path(opts.part1_in) / f"r{os.environ.get('RANK', '0')}" if distributed \
        else Path(tempfile.mkdtemp(prefix="armorlab-bench-"))
    say = print if int(os.environ.get("RANK", "0")) == 0 else (lambda *a, **k: None)

    base = {"task": {"name": "arithmetic"}, "seed": 0, "max_steps": opts.steps, "val_every": 0,
            "kl_probe_prompts": 0, "save_steps": 10_000, "logging_steps": 1}
    # Part 1 trains at learning rate 0: every variant then generates the very same completions
    # (same seed, same weights), so the comparison is the per-step work and not how long the
    # completions of diverging policies happen to be. All of that work still runs.
    frozen = {"learning_rate": 0.0}
    cfg0 = resolve(base)
    # ... within one epoch of the train set: at an epoch's end stock TRL's sampler draws its next
    # shuffle from its running generator, armorlab's from (seed, epoch) (resumable), and the
    # completions part ways
    world = int(os.environ.get("WORLD_SIZE", "1"))
    prompts = world * opts.steps * cfg0["per_device_train_batch_size"] // cfg0["num_generations"]
    base["task"]["train_size"] = max(256, prompts)
    cfg0 = resolve(base)
    task = build_task(cfg0["task"])
    model_path = str(prepare_model(cfg0["model"], cfg0["task"]))
    spg = cfg0["steps_per_generation"]

    def quiet(trainer):
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        return trainer

    def stock(out: Path):
        trl_keys = {k: v for k, v in cfg0.items() if k not in ("task", "model") and k in
                    {f for f in GRPOConfig.__dataclass_fields__}}
        args = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to=[], loss_type="dapo",
                          **{**trl_keys, **frozen, "beta": 0.0}, save_strategy="no", disable_tqdm=True)
        return quiet(GRPOTrainer(model_path, task.reward_funcs, args=args, train_dataset=task.train))

    def armorlab(objective: str, trainer_cls=ArmorLabTrainer, **extra):
        def make(out: Path):
            cfg = resolve({**base, "objective": objective, **extra})
            rd = RunDir.create(out, cfg)
            args = make_args(cfg, rd)
            args.save_strategy, args.disable_tqdm = "no", True
            own = build_task(cfg["task"])
            return quiet(trainer_cls(model_path, own.reward_funcs, args, train_dataset=own.train,
                                     tokens_dir=rd.tokens_dir, callbacks=[RunDirLogger(rd)]))
        return make

    def run(make, out: Path, prepare=None) -> tuple[list[float], object]:
        """One trainer alone (part 2): its cycle times, warm-up dropped, timed as in lockstep."""
        shutil.rmtree(out, ignore_errors=True)
        trainer = make(out)
        if prepare is not None:
            prepare(trainer)
        steps = lockstep.run_lockstep({"alone": trainer}, clock)["alone"]
        return lockstep.cycles(steps, spg), trainer

    def same_completions(trainers: dict) -> None:
        """The pairing's premise: at learning rate 0 every variant generates the same completions
        (not the anchored one: its reference draws take numbers from the generation's RNG)."""
        def lengths(trainer):
            return [h[k] for h in trainer.state.log_history for k in h if k.endswith("completions/mean_length")]
        names = [n for n in trainers if n not in UNPAIRED]
        ref = lengths(trainers[names[0]])
        for name in names[1:]:
            mine = lengths(trainers[name])
            if mine != ref:
                at = next((i for i, (a, b) in enumerate(zip(mine, ref, strict=False)) if a != b), min(len(mine), len(ref)))
                raise SystemExit(f"{name} generated other completions than {names[0]}: mean length "
                                 f"{mine[at:at + 3]} vs {ref[at:at + 3]} from generation {at} "
                                 f"({len(mine)} vs {len(ref)} generations)")

    def split(trainer) -> lockstep.Split:
        """Time a trainer's policy generation, reference draws and whole generation-and-scoring."""
        parts = {"policy": (trainer, "_generate_single_turn"), "score": (trainer, "_generate_and_score_completions")}
        sampler = getattr(trainer, "reference_sampler", None)
        if getattr(trainer, "anchor_rollout", None) is not None:
            parts["draws"] = (sampler, "sample")
        if hasattr(trainer, "_add_reference_logps"):  # armorlab's π_ref forward over the generation batch
            parts["ref_forward"] = (trainer, "_add_reference_logps")
        return lockstep.Split(trainer, parts, spg, clock)

    def lockstep_round(makers: dict, root: Path, splits: dict | None = None,
                       beyond: dict | None = None) -> dict[str, list[float]]:
        """One fresh trainer per variant, trained in lockstep; each variant's cycle times, warm-up
        dropped. With ``splits``, each variant's mean split of this round's cycles is appended to it;
        with ``beyond``, each variant's cycle times of this round less its reference work (π_ref
        forward and draws), cycle by cycle, are put in it."""
        trainers, rng, timers = {}, {}, {}
        for i, (name, make) in enumerate(makers.items()):
            out = root / f"v{i}"
            shutil.rmtree(out, ignore_errors=True)
            trainers[name] = make(out)
            rng[name] = lockstep.rng_state()  # as after building it alone: Trainer.__init__ seeds
            if splits is not None:
                timers[name] = split(trainers[name])
        steps = lockstep.run_lockstep(trainers, clock, rng)
        same_completions(trainers)
        per_cycle = {name: lockstep.cycles(times, spg) for name, times in steps.items()}
        for name, timer in timers.items():
            counted = range(1, 1 + len(per_cycle[name]))  # the cycles lockstep.cycles kept
            policy, draws, ref_fwd = (timer.mean(part, counted) if part in timer.spent else 0.0
                                      for part in ("policy", "draws", "ref_forward"))
            scoring = timer.mean("score", counted) - policy - draws - ref_fwd
            whole = statistics.mean(per_cycle[name]) if per_cycle[name] else 0.0
            splits.setdefault(name, []).append((policy, draws, ref_fwd, scoring,
                                                whole - policy - draws - ref_fwd - scoring))
            if beyond is not None:
                reference = [sum(timer.spent[p].get(c, 0.0) for p in ("draws", "ref_forward") if p in timer.spent)
                             for c in counted]
                beyond[name] = [t - r for t, r in zip(per_cycle[name], reference, strict=True)]
        return per_cycle

    parts = {int(p) for p in opts.parts.split(",")}
    ratios = {}
    if 1 in parts:
        # ---------------------------------------------------------------- part 1
        variants = {PEER: stock, "armorlab dapo": armorlab("dapo", **frozen), "armorlab up": armorlab("up", **frozen),
                    "armorlab dapo (paper telemetry)": armorlab("dapo", **PAPER_TELEMETRY, **frozen),
                    "armorlab up (paper telemetry)": armorlab("up", **PAPER_TELEMETRY, **frozen),
                    "armorlab armor (anchor off)": armorlab("armor", anchor=False, anchor_gate=False, **frozen),
                    ANCHORED: armorlab("armor", **frozen)}  # the armor preset: anchors and gate on
        if opts.variants:
            keep = set(opts.variants.split(","))
            unknown = keep - {slug(n) for n in variants}
            if unknown:
                raise SystemExit(f"--variants: no variant named {', '.join(sorted(unknown))} "
                                 f"(names: {', '.join(slug(n) for n in variants if n != PEER)})")
            variants = {n: m for n, m in variants.items() if n == PEER or slug(n) in keep}
        if opts.control:
            variants["stock again"] = stock  # known truth 1: the noise floor of the statistic
        names = list(variants)
        paired: dict[str, list[float]] = {name: [] for name in names}
        pooled: dict[str, list[float]] = {name: [] for name in names}
        splits: dict[str, list[tuple[float, ...]]] = {}
        beyond_paired: dict[str, list[float]] = {name: [] for name in names}  # less reference work / stock
        for _ in range(opts.rounds):
            beyond: dict[str, list[float]] = {}
            per_cycle = lockstep_round(variants, work, splits, beyond)
            for name in names:
                pooled[name].extend(per_cycle[name])
                paired[name].extend(mine / ref for mine, ref in zip(per_cycle[name], per_cycle[names[0]], strict=True))
                beyond_paired[name].extend(mine / ref for mine, ref in zip(beyond[name], per_cycle[names[0]], strict=True))
        unit = "wall" if opts.wall else "cpu"
        procs = os.environ.get("WORLD_SIZE", "1")
        prefix = "two_proc_" if distributed else ""  # part 4's lines
        say(f"# step overhead, {procs} process(es): {opts.rounds} rounds × {opts.steps} steps, the variants in "
            f"lockstep (a step each in turn), {unit} time per generation cycle ({spg} steps); ratio = median over "
            f"cycles of the variant's cycle / {names[0]}'s same cycle (the same completions)")
        say(f"# peer: stock trl {trl_version} GRPOTrainer(loss_type='dapo', beta=0.0): no reference model; "
            f"tiny model, {cfg0['per_device_train_batch_size']} rows per step, G = {cfg0['num_generations']}, "
            f"{cfg0['max_completion_length']} new tokens, learning rate 0, one intra-op thread")
        for name in names:
            ratios[name] = statistics.median(paired[name])
            say(f"{prefix}{slug(name)}_ms_per_cycle={1000 * statistics.median(pooled[name]):.1f}")
            say(f"{prefix}{slug(name)}_cycles={len(pooled[name])}")
            if name != names[0]:
                q = statistics.quantiles(paired[name], n=4)
                say(f"# {prefix}{slug(name)} per-cycle ratios: quartiles {q[0]:.3f}, {q[1]:.3f}, {q[2]:.3f}")
            target = f"  # target ≤ {TARGETS[name]:.2f}" if name in TARGETS else ""
            say(f"{prefix}{slug(name)}_ratio={ratios[name]:.3f}{target}")
            if name in splits:  # mean over rounds of each round's mean cycle split
                means = [statistics.mean(r[i] for r in splits[name]) for i in range(len(SPLIT))]
                say(f"{prefix}{slug(name)}_split_ms=" + ",".join(
                    f"{label}:{1000 * v:.1f}" for label, v in zip(SPLIT, means, strict=True)))
            if name in REFERENCE_WORK:  # what is left once π_ref's own forward and draws are taken out
                say(f"{prefix}{slug(name)}_beyond_reference_ratio={statistics.median(beyond_paired[name]):.3f}"
                    f"  # its cycle less the π_ref forward and draws, over {names[0]}'s cycle")
        if opts.control:
            control = ratios.pop("stock again")
            say(f"{prefix}stock_vs_stock_ratio={control:.3f}  # known truth 1.000")
        if distributed:
            say(f"overhead_2proc_max={max(ratios.get(n, 0.0) for n in TARGETS if TARGETS[n] <= 1.03):.3f}")
            return

    if 2 in parts:
        # ---------------------------------------------------------------- part 2
        # the train set is exactly one generation batch, so every prompt recurs once per generation
        # and 4 times per reference window of 4 generations
        per_generation = cfg0["per_device_train_batch_size"] * spg // cfg0["num_generations"]
        tau = 4 * spg
        anchor_base = {"task": {"name": "arithmetic", "train_size": per_generation}, "anchor": True,
                       "anchor_gate": True, "ref_reset_steps": tau, "max_steps": 2 * tau}

        def forget(trainer):
            rollout = trainer.anchor_rollout
            original = rollout.run

            def run_without_cache(*args, **kwargs):
                rollout.cache.clear()
                return original(*args, **kwargs)

            rollout.run = run_without_cache

        print(f"# anchor rollout: {per_generation} prompts, each recurring 4× per reference window (τ={tau} steps), "
              f"k={cfg0['anchor_samples'] or 4}")
        results = {}
        for label, prepare in (("with cache", None), ("without cache", forget)):
            samples, times = [], []
            for _ in range(max(1, opts.rounds // 2)):
                t, trainer = run(armorlab("armor", **anchor_base), work / "anchor", prepare)
                times.extend(t)
                logged = [h["anchor/ref_samples"] for h in trainer.state.log_history if "anchor/ref_samples" in h]
                samples.append(sum(logged) / len(logged))
            results[label] = (statistics.mean(samples), statistics.median(times))
        for label, (per_step, cycle) in results.items():
            print(f"anchor_{slug(label)}_ref_samples_per_step={per_step:.2f}")
            print(f"anchor_{slug(label)}_ms_per_cycle={1000 * cycle:.1f}")
        saved = results["without cache"][0] / max(results["with cache"][0], 1e-9)
        print(f"anchor_cache_ref_sample_reduction={saved:.1f}")
        print(f"anchor_cache_cycle_ratio={results['with cache'][1] / results['without cache'][1]:.3f}")
    fwd_ratio = None
    if 3 in parts:
        # ---------------------------------------------------------------- part 3
        class NoForwardKL(ArmorLabTrainer):
            forward_kl_share = 0.0

        fwd = {"forward KL on": armorlab("armor", **frozen),
               "forward KL off": armorlab("armor", trainer_cls=NoForwardKL, **frozen)}
        fwd_cycles: dict[str, list[float]] = {name: [] for name in fwd}
        fwd_paired: list[float] = []
        for _ in range(opts.rounds):
            per_cycle = lockstep_round(fwd, work / "fwd")
            for name in fwd:
                fwd_cycles[name].extend(per_cycle[name])
            fwd_paired.extend(on / off for on, off in zip(*per_cycle.values(), strict=True))
        fwd_ratio = statistics.median(fwd_paired)
        every = round(1 / ArmorLabTrainer.forward_kl_share)
        print(f"# forward KL: armor (anchors + gate on), each fresh prompt's first reference draw scored on 1 "
              f"generation in {every}; on and off in lockstep, ratio = median over cycles of on's cycle / off's same cycle")
        for name, c in fwd_cycles.items():
            print(f"{slug(name)}_ms_per_cycle={1000 * statistics.median(c):.1f}")
            print(f"{slug(name)}_cycles={len(c)}")
        print(f"forward_kl_overhead={fwd_ratio:.3f}")
    if 4 in parts:
        two_process_part(opts, work / "distributed")
    shutil.rmtree(work, ignore_errors=True)
    small = [ratios[n] for n in TARGETS if TARGETS[n] <= 1.03 and n in ratios]
    if small:
        print(f"overhead_max={max(small):.3f}")


PEER = "stock dapo (beta=0)"
ANCHORED = "armorlab armor (anchors + gate)"
UNPAIRED = {ANCHORED}  # generates other completions than the peer (its reference draws use the RNG)
PAPER_TELEMETRY = {"token_sample_rate": 0.001}  # sweeps/paper/base.yaml's (kl_probe_prompts 0 as here, kl_telemetry on)
TARGETS = {"armorlab dapo": 1.03, "armorlab up": 1.03, "armorlab dapo (paper telemetry)": 1.03,
           "armorlab up (paper telemetry)": 1.03, "armorlab armor (anchor off)": 1.20, ANCHORED: 1.35}
REFERENCE_WORK = ("armorlab armor (anchor off)", ANCHORED)  # variants whose objective reads π_ref on every row
SPLIT = ("policy_generation", "reference_draws", "reference_forward", "scoring", "training")


def slug(name: str) -> str:
    """``"armorlab armor (anchor off)"`` → ``armorlab_armor_anchor_off``: a name for ``name=value``."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def two_process_part(opts: argparse.Namespace, work: Path) -> None:
    """Part 1 under torchrun in 2 processes; its main process prints the lines."""
    import subprocess
    import sys

    work.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
            "--part1-in", str(work), "--steps", str(opts.steps), "--rounds", str(opts.rounds)]
    proc = subprocess.run(argv + (["--wall"] if opts.wall else []), capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    print(proc.stdout, end="")
    if proc.returncode != 0:
        raise SystemExit(f"part 4 (2 processes) failed:\n{proc.stderr[-3000:]}")


if __name__ == "__main__":
    main()
