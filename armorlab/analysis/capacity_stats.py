"""Probability capacity and KL statistics of per-token samples (a run's ``tokens/`` parquet).

The capacity *formulas* are armorlab.algos.capacity's (UP Eq. 11, ARMOR Eq. 6) — the same code the
trainer's ``armorlab.algos.loss.probability_capacity`` runs on torch tensors — called here on numpy
arrays. This module adds what only offline analysis needs:

* ``token_kernel``: one streaming pass over millions of tokens giving the KL estimates
  (armorlab.algos.kl: reverse k1/k2/k3, and K4's next-token forward KL at the policy's own
  prefixes — not the sequence-level forward KL, see kl.K4) and the capacity
  statistics of capacity.capacity_stats (pos_mean, pos_bound_frac, neg_mean) plus the
  capacity-limited share below. It works in cache-sized chunks with sums instead of masks and
  boolean indexing, so it runs near memory bandwidth; tests check it against kl.* and
  capacity.capacity_stats on the same arrays.
* (CL) capacity-limited share of low-probability correct tokens: among tokens with A > 0 and
  π_old < p_low (default 0.2), the share whose capacity is bound by the clip (capacity <
  1 − π_old, capacity_stats' ``pos_bound_frac`` rule). These are the tokens UP argues clipping
  starves: rare but correct, they cannot grow past (1+ε)·π_old in one update.
* ``counterfactual_capacity``: the capacity the *same* tokens would have under other objectives
  (UP vs clipped vs ARMOR), for the capacity-distribution plot.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.algos import capacity, kl
from armorlab.algos.objectives import default_alpha, objective_spec

log = logging.getLogger(__name__)

P_LOW = 0.2
CHUNK = 32768  # float32: 128 KiB per array, the kernel's eight chunk arrays (1 MiB) stay in L2 cache


def capacity_limited_share(cap, p_old, sign, weight, *, p_low: float = P_LOW) -> float:
    """(CL) Weighted share of A > 0 tokens with π_old < ``p_low`` whose capacity is clip-bound."""
    low = np.asarray(p_old) < p_low
    return capacity.capacity_stats(cap[low], p_old[low], sign[low], weight[low])["pos_bound_frac"]


def token_kernel(logp, old_logp, ref_logp, advantage, *, objective: str, alpha: Any = 1.0,
                 eps_low: float = 0.2, eps_high: float = 0.28, p_low: float = P_LOW,
                 chunk: int = CHUNK) -> dict[str, float]:
    """KL estimates and capacity statistics of tokens sampled from π_θ, in one chunked pass.

    1-D arrays, one entry per token; ``ref_logp`` may be None (no KL, no ARMOR capacity), ``alpha`` a
    scalar or per token. Returns tokens, reverse_k1|k2|k3, forward_next_token_on_policy (kl.K4),
    pos_mean, pos_bound_frac, neg_mean, low_prob_limited (CL); NaN where undefined. Capacity is
    capacity.token_capacity's (UP Eq. 11, ARMOR Eq. 6) with one widened mass m = π_old + β·π_ref,
    β = (1−α)/α: A > 0 gets min(ε_high·m, 1 − π_old) (bound iff ε_high·m < 1 − π_old; up's is
    1 − π_old, never bound), A < 0 min(ε_low·m, π_old); tests/test_analysis_capacity.py checks it.
    """
    family = capacity.capacity_family(objective)  # ValueError naming an unknown objective
    logp, old_logp, advantage = np.asarray(logp), np.asarray(old_logp), np.asarray(advantage)
    ref = None if ref_logp is None else np.asarray(ref_logp)
    n_all = logp.shape[0]
    if any(a is not None and a.shape != (n_all,) for a in (logp, old_logp, advantage, ref)):
        raise ValueError("token_kernel wants 1-D arrays of one length")
    widened = family == "mixed"
    if widened and ref is None:
        raise ValueError(f"{objective} capacity needs ref_logp")
    alpha_arr = np.asarray(alpha) if widened and np.ndim(alpha) else None
    beta = 0.0 if not widened or alpha_arr is not None else (1.0 - float(alpha)) / float(alpha)
    unbounded = family == "unbounded_positive"
    general = family not in ("clipped", "unbounded_positive", "mixed")  # capacity.token_capacity per chunk
    ones = np.ones(chunk, dtype := np.result_type(logp.dtype, np.float32))
    # seven chunk buffers, reused across the steps, keep the working set in L2 cache
    buf = {k: np.empty(chunk, dtype) for k in ("po", "t1", "t2", "omp", "bd", "pos", "neg")}
    # Every statistic is a dot product of two chunk arrays (BLAS, the fastest reduction numpy
    # has); 0/1 masks are written straight as floats, so counts are dots too (exact: integers
    # below 2**24 per chunk). The running totals are python floats (float64).
    kl_sums = np.zeros(4)  # Σ L, Σ L², Σ E·L, Σ (E − L) (_kl_sums)
    n_pos = n_neg = n_bound = n_low = n_low_bound = pos_sum = neg_sum = 0.0
    for a in range(0, n_all, chunk):
        b = min(a + chunk, n_all)
        n = b - a
        one, t1, t2 = ones[:n], buf["t1"][:n], buf["t2"][:n]
        po = np.exp(old_logp[a:b], out=buf["po"][:n])
        if ref is not None:
            kl_sums += _kl_sums(np.subtract(ref[a:b], logp[a:b], out=t1), one, t2)
        pos = np.greater(advantage[a:b], 0, out=buf["pos"][:n])
        neg = np.less(advantage[a:b], 0, out=buf["neg"][:n])
        n_pos += float(np.dot(pos, one))
        n_neg += float(np.dot(neg, one))
        omp = np.subtract(1.0, po, out=buf["omp"][:n])
        if widened:  # β per token where α is
            al = alpha_arr[a:b] if alpha_arr is not None else None
            m = _widened_mass(po, ref[a:b], beta if al is None else (1.0 - al) / al, t1)
        else:
            m = po
        bound = None
        if general:
            cap = capacity.token_capacity(objective, po, pos - neg, eps_low=eps_low, eps_high=eps_high)
            bound = (cap < omp).astype(dtype)
            pos_sum += float(np.dot(cap, pos))
            neg_sum += float(np.dot(cap, neg))
            n_bound += float(np.dot(bound, pos))
        elif unbounded:
            pos_sum += float(np.dot(omp, pos))
        else:
            cp = np.multiply(m, eps_high, out=t2)
            bound = np.less(cp, omp, out=buf["bd"][:n])
            pos_sum += float(np.dot(np.minimum(cp, omp, out=cp), pos))
            n_bound += float(np.dot(bound, pos))
        if not general:
            cn = np.multiply(m, eps_low, out=omp)
            neg_sum += float(np.dot(np.minimum(cn, po, out=cn), neg))
        low = np.less(po, p_low, out=t2)
        n_low += float(np.dot(low, pos))
        if bound is not None:
            low *= bound
            n_low_bound += float(np.dot(low, pos))
    nan, n = math.nan, float(n_all)
    s_l, s_ll, s_el, s_d = (float(x) for x in kl_sums)
    kl = ((-s_l / n, 0.5 * s_ll / n, s_d / n, (s_el - s_d) / n) if ref is not None and n_all else (nan,) * 4)
    return {"tokens": n, **dict(zip(("reverse_k1", "reverse_k2", "reverse_k3", "forward_next_token_on_policy"),
                                    kl, strict=True)),
            "pos_mean": pos_sum / n_pos if n_pos else nan, "pos_bound_frac": n_bound / n_pos if n_pos else nan,
            "neg_mean": neg_sum / n_neg if n_neg else nan,
            "low_prob_limited": n_low_bound / n_low if n_low else nan}


def _kl_sums(L: np.ndarray, one: np.ndarray, E: np.ndarray) -> np.ndarray:
    """(K1-K4) sums of one chunk, L = log π_ref − log π_θ and E = e^L − 1 (written into ``E``): k1 = −L,
    k2 = ½L², k3 = E − L; K4's w log w − w + 1 with w = e^L is E·L − (E − L)."""
    E = np.expm1(L, out=E)
    s_l, s_ll, s_el = float(np.dot(L, one)), float(np.dot(L, L)), float(np.dot(E, L))
    return np.array([s_l, s_ll, s_el, float(np.dot(np.subtract(E, L, out=E), one))])


def _widened_mass(po: np.ndarray, ref_logp: np.ndarray, beta: Any, out: np.ndarray) -> np.ndarray:
    """m = π_old + β·π_ref (ARMOR Eq. 6's widening), β = (1−α)/α a scalar or per token, into ``out``."""
    m = np.exp(ref_logp, out=out)
    m *= beta
    m += po
    return m


def anchor_kl(logp, ref_logp) -> dict[str, float]:
    """k1 and k3 means (kl.K1, K3, log r = log π_θ − log π_ref) on anchor tokens, as the trainer's
    ``anchor/kl_k*``. Anchors are samples of π_ref *conditioned on a correct reward*, so this
    estimates neither KL direction: it is how far π_θ has moved on the reference's correct
    answers (the unconditioned forward KL is the trainer's ``kl/forward_k*``)."""

    logp, ref_logp = np.asarray(logp), np.asarray(ref_logp)
    if logp.size == 0:
        return {"anchor_kl_k1": math.nan, "anchor_kl_k3": math.nan}
    return {"anchor_kl_k1": kl.forward_kl(logp, ref_logp, estimator_name="k1"),
            "anchor_kl_k3": kl.forward_kl(logp, ref_logp, estimator_name="k3")}


# --------------------------------------------------------------------------- tokens/ parquet
def read_tokens(run_path: str | Path, columns=None):
    """A run's tokens/ parquet samples as one DataFrame, or None when it has none."""
    tokens_dir = Path(run_path) / "tokens"
    files = sorted(tokens_dir.glob("*.parquet")) if tokens_dir.is_dir() else []
    if not files:
        return None
    import pandas as pd
    import pyarrow.parquet as pq

    frames = []
    for f in files:
        try:
            frames.append(pq.read_table(f).to_pandas())
        except Exception as exc:  # a half-written sample file must not sink the report
            log.warning("skipping unreadable token sample %s: %s", f, exc)
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True)
    return df[[c for c in (columns or df.columns) if c in df.columns]]


def objective_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """Capacity parameters of a run from its resolved config (objective, α, ε_low, ε_high); the clip
    a config leaves out is its objective's (the registry's ObjectiveSpec.clip). α is 1 (no mixing)
    for a run that has none: only the mixed family reads it."""
    objective = config.get("objective", "dapo")
    eps_low, eps_high = objective_spec(objective).clip()
    alpha = config.get("alpha")
    return {"objective": objective, "alpha": 1.0 if alpha is None else float(alpha),
            "eps_low": float(config.get("epsilon", eps_low)), "eps_high": float(config.get("epsilon_high", eps_high))}


def token_stats(tokens, config: Mapping[str, Any], *, p_low: float = P_LOW) -> dict[str, float]:
    """token_kernel over a run's token sample with the run's own objective, plus anchor_kl on the
    anchor rows when the sample marks them (``is_anchor``)."""
    params = objective_params(config)
    has_ref = "ref_logp" in tokens.columns and tokens["ref_logp"].notna().all()
    is_anchor = (tokens["is_anchor"].to_numpy(dtype=bool) if "is_anchor" in tokens.columns
                 else np.zeros(len(tokens), dtype=bool))
    policy = tokens[~is_anchor]
    if capacity.capacity_family(params["objective"]) == "mixed" and not has_ref:
        log.info("no ref_logp in token sample: %s capacity uses the plain trust region (α = 1)", params["objective"])
        params = {**params, "objective": "dapo"}  # a clipped objective, with this run's ε
    out = token_kernel(policy["logp"].to_numpy(), policy["old_logp"].to_numpy(),
                       policy["ref_logp"].to_numpy() if has_ref else None,
                       policy["advantage"].to_numpy(), p_low=p_low, **params)
    if has_ref and is_anchor.any():
        anchors = tokens[is_anchor]
        out.update(anchor_kl(anchors["logp"].to_numpy(), anchors["ref_logp"].to_numpy()))
    else:
        out.update(anchor_kl_k1=math.nan, anchor_kl_k3=math.nan)
    return out


def counterfactual_capacity(tokens, config: Mapping[str, Any],
                            objectives=("up", "dapo", "armor")) -> dict[str, np.ndarray]:
    """Capacity of the sample's A > 0 policy tokens under each objective's formula (same tokens,
    same ε; a mixed objective with the run's α, or ARMOR's default (G−1)/G for a run that mixes
    nothing). The mixed family needs ref_logp."""
    params = objective_params(config)
    mixes = capacity.capacity_family(params["objective"]) == "mixed" or config.get("alpha") is not None
    alpha = params["alpha"] if mixes else default_alpha(int(config["num_generations"]))
    keep = tokens["advantage"].to_numpy() > 0
    if "is_anchor" in tokens.columns:
        keep &= ~tokens["is_anchor"].to_numpy(dtype=bool)
    p_old = np.exp(tokens["old_logp"].to_numpy(dtype=np.float64)[keep])
    sign = np.ones_like(p_old)
    p_ref = (np.exp(tokens["ref_logp"].to_numpy(dtype=np.float64)[keep])
             if "ref_logp" in tokens.columns and tokens["ref_logp"].notna().all() else None)
    out = {}
    for obj in objectives:
        if capacity.capacity_family(obj) == "mixed" and p_ref is None:
            continue
        out[obj] = capacity.token_capacity(obj, p_old, sign, p_ref=p_ref, alpha=alpha,
                                           eps_low=params["eps_low"], eps_high=params["eps_high"])
    return out
