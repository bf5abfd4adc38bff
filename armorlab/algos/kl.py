"""KL divergence between the policy π_θ and the reference π_ref: sample estimators and exact values,
each formula written once for numpy arrays and torch tensors alike.

Sample estimators (J. Schulman, "Approximating KL Divergence", 2020). For KL(q‖p) with samples
x ~ q and the log-ratio ``log_r = log p(x) − log q(x)``:

    (K1)  k1 = −log r                   unbiased, high variance, can be negative
    (K2)  k2 = ½ (log r)²               biased (bias grows with the KL), low variance, ≥ 0
    (K3)  k3 = (r − 1) − log r          unbiased (E_q[r] = 1), ≥ 0 elementwise

Which direction a sample estimates depends only on who drew the samples:

    reverse KL(π_θ ‖ π_ref): x ~ π_θ (ordinary rollouts),      log_r = log π_ref − log π_θ
    forward KL(π_ref ‖ π_θ): x ~ π_ref (unconditioned draws),  log_r = log π_θ − log π_ref

(ARMOR, arXiv 2607.10481, Fig. 2b plots both: forward KL measures how much of the reference's
mass the policy has dropped, reverse KL how far the policy's own samples moved.) Reward-filtered
samples of π_ref (ARMOR's anchors) are neither direction's samples.

(K3v) verl's ``low_var_kl`` (verl 0.9.1 ``core_algos.kl_penalty_forward``): k3 with the
      log-ratio clamped to [−20, 20] before the exponential and the per-token value clamped to
      [−10, 10]; evaluated as verl writes it, exp(log_r) − log_r − 1, so it matches verl bit for bit.

(K4)  next-token forward KL at the policy's own prefixes, by importance weighting: at a prefix
      y<t with the token x ~ π_θ(·|y<t) and w = π_ref(x|y<t)/π_θ(x|y<t),
      KL(π_ref(·|y<t) ‖ π_θ(·|y<t)) = E_θ[w log w] = E_θ[w log w − w + 1]; the second form (used
      here) is ≥ 0 elementwise and has lower variance, since E_θ[w] = 1. Averaged over a policy
      token sample it estimates E_{y~π_θ}[mean_t KL(π_ref(·|y<t) ‖ π_θ(·|y<t))], the forward KL of
      the next-token conditionals along π_θ's trajectories — NOT the sequence-level
      KL(π_ref‖π_θ) = E_{y~π_ref}[Σ_t KL(π_ref(·|y<t) ‖ π_θ(·|y<t))], whose prefixes come from π_ref.

(K5)  exact categorical KL: KL(p‖q) = Σ_i p_i (log p_i − log q_i), with 0·log 0 = 0 and +∞ where
      q_i = 0 < p_i.

Every function takes numpy arrays (anything ``np.asarray`` accepts) or torch tensors and returns
the same kind, keeping the input dtype; the array namespace comes from ``array_api_compat``, so
importing this module does not import torch. Torch results keep their autograd graph (the
trainer's β·KL penalty differentiates k2/k3).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_array_api_obj

ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")


def _array(x: Any) -> Any:
    """``x`` itself when it is an array of some library (numpy, torch, ...), else ``np.asarray(x)``."""
    return x if is_array_api_obj(x) else np.asarray(x)


def k1(log_r: Any) -> Any:
    """(K1) k1 = −log r, with log_r = log p(x) − log q(x), x ~ q; E_q[k1] = KL(q‖p)."""
    return -_array(log_r)


def k2(log_r: Any) -> Any:
    """(K2) k2 = ½ (log r)²: low variance, but E_q[k2] is the f-divergence with f(r) = ½ (log r)²,
    which matches KL(q‖p) only to second order, so its bias grows with the KL."""
    log_r = _array(log_r)
    return 0.5 * log_r * log_r


def k3(log_r: Any) -> Any:
    """(K3) k3 = (r − 1) − log r, r = exp(log_r); unbiased for KL(q‖p) and ≥ 0 elementwise.

    Computed as expm1(log_r) − log_r so that tiny log-ratios do not cancel catastrophically.
    """
    log_r = _array(log_r)
    return array_namespace(log_r).expm1(log_r) - log_r


def low_var_kl(log_r: Any) -> Any:
    """(K3v) verl's low_var_kl: clamp(exp(l) − l − 1, −10, 10) with l = clamp(log_r, −20, 20).

    The clamps bound one token's penalty (and cut its gradient where they bind): k3 grows as
    exp(log_r), so a single token whose π_θ fell far below π_ref would otherwise dominate the loss.
    """
    log_r = _array(log_r)
    xp = array_namespace(log_r)
    clamped = xp.clip(log_r, -VERL_LOG_RATIO_CLAMP, VERL_LOG_RATIO_CLAMP)
    return xp.clip(xp.exp(clamped) - clamped - 1, -VERL_KL_CLAMP, VERL_KL_CLAMP)


# verl 0.9.1 core_algos.kl_penalty_forward("low_var_kl"): the log-ratio's and the value's clamps
VERL_LOG_RATIO_CLAMP, VERL_KL_CLAMP = 20.0, 10.0
# the penalty's estimators (config key kl_estimator); telemetry uses ESTIMATORS only
PENALTY_ESTIMATORS: tuple[str, ...] = ("k3", "k2", "low_var_kl")
_KERNELS = {"k1": k1, "k2": k2, "k3": k3, "low_var_kl": low_var_kl}


def estimator(name: str):
    """The estimator function called ``name`` ("k1", "k2", "k3" or "low_var_kl")."""
    try:
        return _KERNELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown KL estimator {name!r} (known: {', '.join(_KERNELS)})") from None


def reverse_kl_tokens(logp: Any, ref_logp: Any, estimator_name: str = "k3") -> Any:
    """Per-token estimate of reverse KL(π_θ‖π_ref) from samples of π_θ: k(log π_ref − log π_θ)."""
    return estimator(estimator_name)(_array(ref_logp) - _array(logp))


def forward_kl_tokens(logp: Any, ref_logp: Any, estimator_name: str = "k3") -> Any:
    """Per-token estimate of forward KL(π_ref‖π_θ) from samples of π_ref: k(log π_θ − log π_ref)."""
    return estimator(estimator_name)(_array(logp) - _array(ref_logp))


def next_token_forward_kl_is_tokens(logp: Any, ref_logp: Any) -> Any:
    """(K4) Per-token w·log w − w + 1 with w = π_ref/π_θ, x ~ π_θ: each token's estimate of the
    next-token KL(π_ref(·|prefix) ‖ π_θ(·|prefix)) at the prefix π_θ produced."""
    log_w = _array(ref_logp) - _array(logp)
    w = array_namespace(log_w).exp(log_w)
    return w * log_w - w + 1.0


def exact_kl_from_logprobs(logp: Any, logq: Any, axis: int = -1) -> Any:
    """(K5) KL(p‖q) = Σ_i p_i (log p_i − log q_i) over ``axis`` from full log-probability vectors
    (e.g. log_softmax of logits); 0·log 0 = 0 where p_i = 0."""
    logp, logq = _array(logp), _array(logq)
    xp = array_namespace(logp, logq)
    p = xp.exp(logp)
    with np.errstate(invalid="ignore"):  # −inf − (−inf) = NaN where both vanish: masked out by p > 0
        diff = logp - logq
    return xp.sum(xp.where(p > 0, p * diff, xp.zeros_like(p)), axis=axis)


def exact_kl(p: Any, q: Any, axis: int = -1) -> np.ndarray:
    """(K5) KL(p‖q) over ``axis`` for probability vectors p, q (float64 numpy).

    0·log(0/q) = 0; p_i > 0 = q_i gives +∞. Rows are not renormalised: pass distributions.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {p.shape} and {q.shape}")
    if np.any(p < 0) or np.any(q < 0):
        raise ValueError("probabilities must be non-negative")
    with np.errstate(divide="ignore", invalid="ignore"):
        return exact_kl_from_logprobs(np.log(p), np.log(q), axis=axis)


def masked_mean(values: Any, mask: Any = None) -> float:
    """Mean over the tokens where ``mask`` is true (all tokens when None), in float64; NaN when none."""
    values = np.asarray(values)
    if mask is None:
        return float(np.mean(values, dtype=np.float64)) if values.size else float("nan")
    mask = np.asarray(mask, dtype=bool)
    n = int(np.count_nonzero(mask))
    if n == 0:
        return float("nan")
    return float(np.sum(values, where=mask, dtype=np.float64) / n)


def reverse_kl(logp: Any, ref_logp: Any, mask: Any = None, estimator_name: str = "k3") -> float:
    """Reverse KL(π_θ‖π_ref) per token, averaged over ``mask``; samples must come from π_θ."""
    return masked_mean(reverse_kl_tokens(np.asarray(logp), np.asarray(ref_logp), estimator_name), mask)


def forward_kl(logp: Any, ref_logp: Any, mask: Any = None, estimator_name: str = "k3") -> float:
    """Forward KL(π_ref‖π_θ) per token, averaged over ``mask``; samples must come from π_ref."""
    return masked_mean(forward_kl_tokens(np.asarray(logp), np.asarray(ref_logp), estimator_name), mask)
