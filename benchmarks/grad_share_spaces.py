"""How far the logged gradient shares (taken on ∂L/∂log π_θ per token, issue 36) are from the same
shares taken on the weights' gradient (the probe before issue 36, which ran only in one process
without checkpointing), on the same micro-batches of a tiny-model ARMOR run.

    .venv/bin/python benchmarks/grad_share_spaces.py [--seeds 0 1] [--steps 12]

The weights' parts are built from the token parts: g_part = Jᵀ·v_part, one ``autograd.grad`` of
log π_θ with ``grad_outputs`` = v_part (anchor rows, on-policy rows, the β·KL term), so both spaces
split the same loss. Printed per share: mean and max |log-prob space − weight space| and their
Spearman rank correlation over the probed steps. Not a pass/fail figure: it says how much the
definition changed what a run logs (docs/metrics.md).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per seed, every one probed")
    opts = parser.parse_args()

    import torch
    import transformers
    from scipy.stats import spearmanr

    import armorlab.train.trainer as trainer_module
    from armorlab.train.mechanism_telemetry import gradient_shares, share_sums, token_gradient

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.trainer_support import build, resolved

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    pairs: dict[str, list[tuple[float, float]]] = {"anchor": [], "kl": [], "cos": []}
    logged = trainer_module.ArmorLabTrainer._grad_shares

    def both_spaces(self, logp, policy_loss, is_anchor, kl_term):
        v, u = token_gradient(policy_loss, logp), token_gradient(kl_term, logp)
        params = [p for p in self.model.parameters() if p.requires_grad]

        def weights(w):
            found = torch.autograd.grad(logp, params, grad_outputs=w, retain_graph=True, allow_unused=True)
            return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(found, params, strict=True)])

        rows = is_anchor.to(v.dtype).unsqueeze(1)
        g_a, g_o, g_k = (weights(w).double() for w in (v * rows, v * (1 - rows), u))
        g_p = g_a + g_o
        n_a, n_o, n_k, n_p = (float(g.norm()) for g in (g_a, g_o, g_k, g_p))
        tokens = gradient_shares(share_sums(v, u, is_anchor).tolist(), anchor=True, kl=True)
        if n_a + n_o > 0 and "obj/anchor_grad_share" in tokens:
            pairs["anchor"].append((tokens["obj/anchor_grad_share"], n_a / (n_a + n_o)))
        if n_k * n_p > 0 and "obj/kl_grad_cos" in tokens:
            pairs["kl"].append((tokens["obj/kl_grad_share"], n_k / (n_k + n_p)))
            pairs["cos"].append((tokens["obj/kl_grad_cos"], float(g_k @ g_p) / (n_k * n_p)))
        return logged(self, logp, policy_loss, is_anchor, kl_term)

    trainer_module.ArmorLabTrainer._grad_shares = both_spaces
    for seed in opts.seeds:
        cfg = resolved(objective="armor", beta=0.1, grad_share_every=1, learning_rate=1e-4, max_steps=opts.steps,
                       ref_reset_steps=0, seed=seed, task={"name": "arithmetic", "train_size": 64})
        with tempfile.TemporaryDirectory(prefix="armorlab-bench-") as tmp:
            build(Path(tmp), cfg).train()
    print(f"# ARMOR + anchors + β = 0.1, tiny model, lr 1e-4, seeds {opts.seeds}, {opts.steps} steps each, every "
          "micro-batch probed (one process: the weight space needs it)")
    for name, values in pairs.items():
        diffs = [abs(a - b) for a, b in values if math.isfinite(a) and math.isfinite(b)]
        rho = spearmanr([a for a, _ in values], [b for _, b in values]).statistic
        print(f"{name:6s} n={len(diffs)} mean_abs_diff={statistics.mean(diffs):.3f} max_abs_diff={max(diffs):.3f} "
              f"spearman={rho:.2f}")


if __name__ == "__main__":
    main()
