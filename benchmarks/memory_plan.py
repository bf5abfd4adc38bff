"""The memory plan's formulas (armorlab/core/memory_plan.py) against bytes measured on CPU tensors:
the tiny model and a ~55 M-parameter Qwen2, each piece of a training step (a micro-batch with and
without gradient checkpointing, no-grad scoring, HF generate, the exact-KL probe, gradients +
AdamW). The peer of each estimate is the measured peak of the same code on the same batch
(tests/memory_support.py: a TorchDispatchMode following every storage). tests/test_memory_plan.py
asserts each ratio within 25 %; this prints them (docs/memory-plan.md quotes the table).

    .venv/bin/python benchmarks/memory_plan.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tests import memory_support as ms  # noqa: E402


def main() -> None:
    rows = []
    for name, build in (("tiny", ms.tiny_model), ("55M Qwen2", ms.qwen_55m)):
        for gc in (True, False):
            (kept, kept_f), (peak, peak_f) = ms.training_step(build, gc)
            label = "checkpointing" if gc else "no checkpointing"
            rows += [(name, f"micro-batch 2 × 64, {label}: kept after forward", kept, kept_f),
                     (name, f"micro-batch 2 × 64, {label}: peak", peak, peak_f)]
        rows.append((name, "no-grad scoring 2 × 64", *ms.scoring(build)))
        for new in (4, 40):
            rows.append((name, f"generate 8 rows × (16 + {new})", *ms.generation(build, new)))
        rows.append((name, "exact-KL probe, 4 rows × 60", *ms.probe(build)))
        for dtype in (torch.float32, torch.bfloat16):
            (_, _), (peak, formula) = ms.optimizer_state(build, dtype)
            rows.append((name, f"gradients + AdamW ({str(dtype)[6:]})", peak, formula))
    print("| model | piece | measured MB | plan MB | plan / measured |\n|---|---|---:|---:|---:|")
    for name, piece, measured, formula in rows:
        print(f"| {name} | {piece} | {measured / 1e6:.2f} | {formula / 1e6:.2f} | {formula / measured:.2f} |")


if __name__ == "__main__":
    main()
