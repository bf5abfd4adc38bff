"""Forward+backward time of every objective relative to dapo, measured side by side in one run.

    .venv/bin/python benchmarks/objectives.py [--batch 512] [--seq 4096] [--repeats 31]
                                              [--threads 1] [--system-malloc]

B×T float32 on CPU. Objectives are timed in a rotating order inside each repeat, a repeat taking
well under a second, so the machine's spells (its speed drifts by a third over seconds) hit all
of them alike; an objective's ratio is the median over repeats of its time / dapo's time in the
same repeat. Target: every ratio ≤ 1.5 (armor does more exp-like work; nothing is quadratic or
loops in Python).
The last line is ``max_ratio=<x>``.

Three settings keep the comparison about the work each objective does:
* the clock is the thread's CPU time (``time.thread_time``) with one intra-op thread, so time
  the scheduler gives to other processes on a shared machine is not counted (``--wall`` uses
  wall-clock time instead, which is what to use with ``--threads`` > 1);
* glibc is told to keep freed memory (mallopt) so each 8 MB temporary is not returned to the
  OS and page-faulted back in on every call; left alone, that page-fault cost swamps the
  arithmetic and makes identical objectives differ by 50%. On a GPU the caching allocator
  does the same. ``--system-malloc`` measures without it.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time


def keep_freed_memory() -> bool:
    """glibc: serve big blocks from the heap and never trim it (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(-3, 2**30)) and bool(libc.mallopt(-1, 2**31 - 1))


# Before torch allocates anything.
KEPT = keep_freed_memory() if __name__ == "__main__" and "--system-malloc" not in sys.argv else False

import torch  # noqa: E402

from armorlab.algos.loss import policy_loss  # noqa: E402
from armorlab.algos.objectives import objective_names  # noqa: E402

OBJECTIVES = objective_names()


def make_batch(batch: int, seq: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, seq, generator=g) * 3.0
    logp = (old + 0.1 * torch.randn(batch, seq, generator=g)).clamp(max=0.0)
    ref = (old + 0.3 * torch.randn(batch, seq, generator=g)).clamp(max=0.0)
    lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=g)
    mask = torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1)
    adv = torch.randn(batch, generator=g)
    return {"logp": logp, "old": old, "ref": ref, "mask": mask, "adv": adv}


def time_once(objective: str, data: dict[str, torch.Tensor], clock=time.thread_time) -> float:
    logp = data["logp"].clone().requires_grad_(True)
    start = clock()
    out = policy_loss(objective, logp, data["old"], data["adv"], data["mask"], ref_logp=data["ref"],
                      alpha=0.8, max_len=logp.shape[1], params={"dro_beta": 0.1} if objective == "dro" else None)
    out.loss.backward()
    return clock() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seq", type=int, default=4096)
    # 31: at 9 repeats and median(objective) / median(dapo), armor read 1.26-1.52 over runs
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--system-malloc", action="store_true", help="don't change glibc malloc settings")
    parser.add_argument("--wall", action="store_true", help="wall-clock time instead of thread CPU time")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.threads > 1 and not args.wall:
        parser.error("thread CPU time only sees the main thread: use --wall with --threads > 1")
    clock = time.perf_counter if args.wall else time.thread_time

    data = make_batch(args.batch, args.seq)
    names = list(OBJECTIVES)
    for name in names:  # warm-up: allocator, kernels
        time_once(name, data, clock)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            times[name].append(time_once(name, data, clock))

    print(f"# objectives forward+backward, B×T = {args.batch}×{args.seq} float32, "
          f"{torch.get_num_threads()} thread(s), {'wall' if args.wall else 'thread CPU'} time, "
          f"{args.repeats} repeats, malloc {'keeps freed memory' if KEPT else 'system default'}; "
          "ratio = median over repeats of objective / dapo in the same repeat")
    ratios = {}
    for name in names:
        ratios[name] = statistics.median(t / d for t, d in zip(times[name], times["dapo"], strict=True))
        print(f"{name}_ms={statistics.median(times[name]) * 1e3:.1f}")
        print(f"{name}_ratio={ratios[name]:.2f}")
    print(f"max_ratio={max(ratios.values()):.2f}")


if __name__ == "__main__":
    main()
