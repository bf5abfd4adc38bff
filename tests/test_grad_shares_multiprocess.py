"""The gradient shares in a multi-process run with gradient checkpointing on (issue 36, item 7):
two training processes on CPU (torchrun, gloo), two micro-batches per step, anchors and β·KL.

The logged shares must be those of the whole step's batch as one process would compute them. The
expected value is built by hand from the token dump (every trained token of both processes): per
token, the gradient of DAPO's clipped surrogate with respect to log π_θ is −A·r where the clip lets
it through (0 elsewhere); that of TRL's default KL term β·k3(x)·π_θ/π_old (x = log π_ref − log π_θ,
k3 = eˣ − x − 1, ``use_bias_correction_kl``) is β·(π_θ/π_old)·(k3 + 1 − eˣ). The normaliser is
common to both parts and cancels in every share.
"""

from __future__ import annotations

import math
import os

import pyarrow.parquet as pq
import pytest
import yaml

from armorlab.core.runs import RunDir
from tests.test_equivalence import torchrun
from tests.trainer_support import model_cache

BETA, EPS_LOW, EPS_HIGH = 0.1, 0.2, 0.28
CONFIG = {
    "objective": "dapo", "dynamic_sampling": False, "anchor": True, "beta": BETA, "grad_share_every": 1,
    "gradient_checkpointing": True, "learning_rate": 1e-3, "max_steps": 2, "seed": 0,
    "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "steps_per_generation": 2,
    "num_generations": 4, "val_every": 0, "kl_probe_prompts": 0, "token_sample_rate": 1.0,
    "task": {"name": "arithmetic", "train_size": 8, "val_size": 8, "test_size": 8},
}


def _token_gradients(row: dict) -> tuple[float, float]:
    """(∂ℓ/∂log π_θ, ∂(β·KL)/∂log π_θ) of one token, up to the common normaliser. Anchor rows take
    DAPO's default anchor ratio π_θ/π_ref (``anchor_ratio: behavior``), the others π_θ/π_old."""
    denominator = row["ref_logp"] if row["is_anchor"] else row["old_logp"]
    ratio, adv = math.exp(row["logp"] - denominator), row["advantage"]
    passes = (adv > 0 and ratio <= 1 + EPS_HIGH) or (adv < 0 and ratio >= 1 - EPS_LOW)
    x = row["ref_logp"] - row["logp"]
    k3 = math.exp(x) - x - 1
    return (-adv * ratio if passes else 0.0), BETA * math.exp(row["logp"] - row["old_logp"]) * (k3 + 1 - math.exp(x))


def _shares_by_hand(rows: list[dict]) -> dict[str, float]:
    sq = {"anchor": 0.0, "on": 0.0, "kl": 0.0, "dot": 0.0}
    for row in rows:
        v, u = _token_gradients(row)
        sq["anchor" if row["is_anchor"] else "on"] += v * v
        sq["kl"] += u * u
        sq["dot"] += u * v
    norm_a, norm_o, norm_k = math.sqrt(sq["anchor"]), math.sqrt(sq["on"]), math.sqrt(sq["kl"])
    norm_p = math.sqrt(sq["anchor"] + sq["on"])
    return {"obj/anchor_grad_share": norm_a / (norm_a + norm_o), "obj/kl_grad_share": norm_k / (norm_k + norm_p),
            "obj/kl_grad_cos": sq["dot"] / (norm_k * norm_p) if norm_k * norm_p > 0 else math.nan}


def test_two_checkpointed_processes_log_the_whole_steps_shares(tmp_path):
    cfg_path = tmp_path / "shares.yaml"
    cfg_path.write_text(yaml.safe_dump(CONFIG))
    os.environ.setdefault("ARMORLAB_CACHE", model_cache())
    done = torchrun(2, "-m", "armorlab", "train", str(cfg_path), "--out", str(tmp_path / "runs"))
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    rd = RunDir(run)
    assert rd.read_status()["world_size"] == 2
    assert yaml.safe_load((run / "config.yaml").read_text())["gradient_checkpointing"] is True
    logged = {row["step"]: row for row in rd.read_metrics() if row["step"] > 0}
    assert sorted(logged) == [1, 2]
    for step, row in logged.items():
        files = sorted(rd.tokens_dir.glob(f"step-{step:06d}-r*.parquet"))
        assert [f.name[-10:] for f in files] == ["r0.parquet", "r1.parquet"]  # both processes' tokens
        tokens = [t for f in files for t in pq.read_table(f).to_pylist()]
        assert any(t["is_anchor"] for t in tokens) and not all(t["is_anchor"] for t in tokens)
        want = _shares_by_hand(tokens)
        got = {name: row.get(name) for name in want}
        assert all(math.isfinite(got[k]) and 0.0 <= got[k] <= 1.0 for k in ("obj/anchor_grad_share", "obj/kl_grad_share"))
        assert 0.0 < got["obj/anchor_grad_share"] < 1.0
        assert got["obj/anchor_grad_share"] == pytest.approx(want["obj/anchor_grad_share"], rel=1e-4)
        if step == 1:  # π_θ = π_ref up to rounding: the KL part vanishes, its cosine is noise
            assert got["obj/kl_grad_share"] == pytest.approx(0.0, abs=1e-4)
            continue
        assert got["obj/kl_grad_share"] > 1e-3   # step 1's update moved π_θ away from π_ref
        assert got == pytest.approx(want, rel=1e-4), step
