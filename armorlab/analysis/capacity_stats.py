"""Probability capacity and KL statistics of a run's ``tokens/`` sample, with armorlab.algos.capacity's
formulas (UP Eq. 11, ARMOR Eq. 6) and armorlab.algos.kl's estimators on numpy (docs/reports.md#kl-and-capacity).
``token_kernel`` streams cache-sized chunks with sums instead of masks (near memory bandwidth); tests check it
against kl.* and capacity.capacity_stats."""

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


def token_kernel(logp, old_logp, ref_logp, advantage, *, objective: str, alpha: Any = 1.0,
                 eps_low: float = 0.2, eps_high: float = 0.28, p_low: float = P_LOW,
                 chunk: int = CHUNK) -> dict[str, float]:
    """KL estimates and capacity statistics (UP Eq. 11, ARMOR Eq. 6; kl.K1–K4; CL) of π_θ's tokens in one
    chunked pass; ``ref_logp`` may be None (no KL, no ARMOR capacity); NaN where undefined.
    (CL) ``low_prob_limited``: of A > 0 tokens with π_old < ``p_low``, the share whose capacity is < 1 − π_old."""
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
    # (K1-K4) L = log π_ref − log π_θ, E = e^L − 1: k1 = −L, k2 = ½L², k3 = E − L, K4 = E·L − (E − L)
    kl_sums = np.zeros(4)  # Σ L, Σ L², Σ E·L, Σ (E − L)
    n_pos = n_neg = n_bound = n_low = n_low_bound = pos_sum = neg_sum = 0.0
    for a in range(0, n_all, chunk):
        b = min(a + chunk, n_all)
        n = b - a
        one, t1, t2 = ones[:n], buf["t1"][:n], buf["t2"][:n]
        po = np.exp(old_logp[a:b], out=buf["po"][:n])
        if ref is not None:
            L = np.subtract(ref[a:b], logp[a:b], out=t1)
            E = np.expm1(L, out=t2)
            kl_sums += [float(np.dot(L, one)), float(np.dot(L, L)), float(np.dot(E, L)),
                        float(np.dot(np.subtract(E, L, out=E), one))]
        pos = np.greater(advantage[a:b], 0, out=buf["pos"][:n])
        neg = np.less(advantage[a:b], 0, out=buf["neg"][:n])
        n_pos += float(np.dot(pos, one))
        n_neg += float(np.dot(neg, one))
        omp = np.subtract(1.0, po, out=buf["omp"][:n])
        m = po
        if widened:  # m = π_old + β·π_ref (ARMOR Eq. 6's widening), β = (1−α)/α, per token where α is
            m = np.exp(ref[a:b], out=t1)
            m *= beta if alpha_arr is None else (1.0 - alpha_arr[a:b]) / alpha_arr[a:b]
            m += po
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


# --------------------------------------------------------------------------- tokens/ parquet
def read_tokens(run_path: str | Path):
    """A run's tokens/ parquet samples as one DataFrame, or None when it has none."""
    files = sorted((Path(run_path) / "tokens").glob("*.parquet"))
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
    return pd.concat(frames, ignore_index=True) if frames else None


def objective_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """(objective, α, ε_low, ε_high) of a run; a missing clip is its objective's, α 1 where nothing mixes."""
    objective = config.get("objective", "dapo")
    eps_low, eps_high = objective_spec(objective).clip()
    alpha = config.get("alpha")
    return {"objective": objective, "alpha": 1.0 if alpha is None else float(alpha),
            "eps_low": float(config.get("epsilon", eps_low)), "eps_high": float(config.get("epsilon_high", eps_high))}


def token_stats(tokens, config: Mapping[str, Any], *, p_low: float = P_LOW) -> dict[str, float]:
    """token_kernel over a run's token sample with its own objective, plus k1, k3 means (kl.K1, K3) on its
    ``is_anchor`` rows as the trainer's ``anchor/kl_k*``: anchors are π_ref samples conditioned on a correct
    reward, so neither KL direction (the forward one is ``kl/forward_k*``)."""
    params, has_ref, is_anchor = objective_params(config), _has_ref(tokens), _is_anchor(tokens)
    policy = tokens[~is_anchor]
    if capacity.capacity_family(params["objective"]) == "mixed" and not has_ref:
        log.info("no ref_logp in token sample: %s capacity uses the plain trust region (α = 1)", params["objective"])
        params = {**params, "objective": "dapo"}  # a clipped objective, with this run's ε
    out = token_kernel(policy["logp"].to_numpy(), policy["old_logp"].to_numpy(),
                       policy["ref_logp"].to_numpy() if has_ref else None,
                       policy["advantage"].to_numpy(), p_low=p_low, **params)
    anchors = tokens[is_anchor] if has_ref else tokens[:0]
    return out | {f"anchor_kl_{k}": kl.forward_kl(anchors["logp"].to_numpy(), anchors["ref_logp"].to_numpy(),
                                                  estimator_name=k) if len(anchors) else math.nan for k in ("k1", "k3")}


def _has_ref(tokens) -> bool:
    return "ref_logp" in tokens.columns and bool(tokens["ref_logp"].notna().all())


def _is_anchor(tokens) -> np.ndarray:
    return tokens["is_anchor"].to_numpy(dtype=bool) if "is_anchor" in tokens.columns else np.zeros(len(tokens), bool)


def counterfactual_capacity(tokens, config: Mapping[str, Any],
                            objectives=("up", "dapo", "armor")) -> dict[str, np.ndarray]:
    """Capacity of the sample's A > 0 tokens under each objective's formula (same tokens and ε; α the run's,
    else ARMOR's default (G−1)/G); the mixed family needs ref_logp."""
    params = objective_params(config)
    mixes = capacity.capacity_family(params["objective"]) == "mixed" or config.get("alpha") is not None
    alpha = params["alpha"] if mixes else default_alpha(int(config["num_generations"]))
    keep = (tokens["advantage"].to_numpy() > 0) & ~_is_anchor(tokens)
    p_old = np.exp(tokens["old_logp"].to_numpy(dtype=np.float64)[keep])
    p_ref = np.exp(tokens["ref_logp"].to_numpy(dtype=np.float64)[keep]) if _has_ref(tokens) else None
    return {obj: capacity.token_capacity(obj, p_old, np.ones_like(p_old), p_ref=p_ref, alpha=alpha,
                                         eps_low=params["eps_low"], eps_high=params["eps_high"])
            for obj in objectives if p_ref is not None or capacity.capacity_family(obj) != "mixed"}
