"""The remedies the field uses now beside ARMOR and UP, each as TRL 1.16 or verl 0.9.1 computes it.

Registered like the built-ins (``armorlab.algos.objectives`` imports this module at its end), with
the same conventions: masked positions of logp/old_logp are 0, advantages are (B, 1), and the
function returns its per-token loss (B, T) — or (B, 1) for a sequence objective — before masking
and aggregation. Where a reference clips a *weight* rather than the ratio (CISPO, DPPO, VESPO) the
loss is ``−sg(weight)·A·log π_θ``: its value is not the PPO surrogate's, its gradient is
``weight·A·∇log π_θ``. ``Surrogate.ratio/lo/hi`` then carry what the objective compares with a bound
(the ratio, π − π_old, or the signed binary KL), so ``obj/clip_frac*`` count the tokens the
objective clips or drops. Each function names its reference; docs/objectives.md lists them with
their capacity family and the differences from the reference that remain (tests/test_field_objectives.py
checks each against an independent statement of the reference's formula).

Like ``objectives``, this module does not import torch at load time (the config layer reads the
registry): clip-cov and kl-cov import it inside the function, for ``randperm``/``topk``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from armorlab.algos.objectives import (
    Batch,
    Surrogate,
    clip_bounds,
    clipped,
    clipped_surrogate,
    register_objective,
    sequence_log_ratio,
    token_clipped,
    token_log_ratio,
)

if TYPE_CHECKING:
    from torch import Tensor

# verl clamps the log-ratio to ±20 before exp in its CISPO, SAPO and DPPO losses
VERL_LOG_RATIO_CLAMP = 20.0
# verl's ActorConfig.clip_ratio_c, DPPO's cap of the (detached) ratio weight; armorlab's dual_clip
VERL_RATIO_CAP = 3.0
# GMPO (Zhao et al. 2025, arXiv 2507.20673, §3): the token log-ratio clipped to (−0.4, 0.4)
GMPO_EPS = {"epsilon": 0.4, "epsilon_high": 0.4}
# Objectives that pick tokens by statistics of the micro-batch they are given (as verl does per
# micro-batch): their loss is not the sum of its parts', at GA > 1 or over processes
MICRO_BATCH_SELECTION = ("clip_cov", "kl_cov")
# Objectives whose reference has no dual clip (a `dual_clip` set with them is refused by the config)
NO_DUAL_CLIP = ("cispo", "cispo_verl", "sapo", "gmpo", "kl_cov", "gpg", "dro", "vespo")


def _unclipped(b: Batch, per_token: Tensor, log_r: Tensor, ratio: Tensor) -> Surrogate:
    """A surrogate no bound stops: the plain ratio under infinite bounds (the metrics count no clip)."""
    lo = b.adv.new_tensor(-math.inf).expand_as(b.adv)
    hi = b.adv.new_tensor(math.inf).expand_as(b.adv)
    return Surrogate(per_token, ratio, lo, hi, log_r, ratio)


def _sided_bounds(b: Batch, low: float, high: float) -> tuple[Tensor, Tensor]:
    """(lo, hi) per row: ``high`` binds for A > 0, ``low`` for A < 0 (as ``clip_bounds``, no dual clip)."""
    pos = b.adv > 0
    inf = b.adv.new_tensor(math.inf)
    return (-inf).where(pos, b.adv.new_tensor(low)), b.adv.new_tensor(high).where(pos, inf)


# =========================================================================== CISPO
@register_objective("cispo", aggregation="token-mean", capacity="unbounded", defaults={"epsilon_high": 5.0})
def cispo(b: Batch) -> Surrogate:
    """CISPO as TRL 1.16 computes it (MiniMax-M1, arXiv 2506.13585, Eq. 4; ScaleRL's ε_max):
    −sg(min(r_t, ε_max))·A·log π_θ, upper clip only, ε_max = ``epsilon_high`` (an absolute cap on r,
    not 1 + ε; TRL recommends 5.0); token-mean."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    ratio = log_r.exp()
    weight = ratio.clamp(max=b.eps_high).detach()
    lo, hi = _sided_bounds(b, -math.inf, b.eps_high)
    return Surrogate(-weight * b.adv * b.logp, ratio, lo, hi, log_r, ratio)


@register_objective("cispo_verl", aggregation="token-mean", capacity="unbounded")
def cispo_verl(b: Batch) -> Surrogate:
    """CISPO as verl 0.9.1 computes it (``compute_policy_loss_cispo``): two-sided,
    −sg(clip(r_t, 1−ε_low, 1+ε_high))·A·log π_θ, r from the log-ratio clamped to ±20; token-mean."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    ratio = log_r.clamp(-VERL_LOG_RATIO_CLAMP, VERL_LOG_RATIO_CLAMP).exp()
    weight = ratio.clamp(1.0 - b.eps_low, 1.0 + b.eps_high).detach()
    lo, hi = b.adv.new_tensor(1.0 - b.eps_low).expand_as(b.adv), b.adv.new_tensor(1.0 + b.eps_high).expand_as(b.adv)
    return Surrogate(-weight * b.adv * b.logp, ratio, lo, hi, log_r, ratio)


# =========================================================================== SAPO
@register_objective("sapo", aggregation="seq-mean-token-mean", capacity="unbounded",
                    params={"sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05})
def sapo(b: Batch) -> Surrogate:
    """SAPO (Gao et al. 2025, arXiv 2511.20347, Eq. 5) as TRL 1.16: −A·σ(τ·(r_t − 1))·4/τ, τ = τ_pos
    for A > 0 else τ_neg (``sapo_temperature_pos/neg``, verl's ``tau_pos/neg``); a soft gate, no
    clip; seq-mean-token-mean (verl's too). verl also clamps log r to ±20 and writes σ·(4/τ)."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    ratio = log_r.exp()
    tau_pos, tau_neg = float(b.params["sapo_temperature_pos"]), float(b.params["sapo_temperature_neg"])
    tau = b.adv.new_tensor(tau_pos).where(b.adv > 0, b.adv.new_tensor(tau_neg))
    gate = (tau * (ratio - 1)).sigmoid() * 4 / tau
    return _unclipped(b, -gate * b.adv, log_r, ratio)


# =========================================================================== GMPO
@register_objective("gmpo", aggregation="seq-mean", capacity="log_clipped", sequence_level=True,
                    defaults=GMPO_EPS)
def gmpo(b: Batch) -> Surrogate:
    """GMPO (Zhao et al. 2025, arXiv 2507.20673, Eq. 6) as verl's ``geo_mean``: the geometric mean of
    the token ratios, each token's log-ratio clipped to (−ε_low, ε_high) on its advantage's side:
    −A_i·exp(mean_t sgn(A)·min(sgn(A)·log r_t, sgn(A)·clip(log r_t))); one loss per sequence."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    # sgn(A)·min(sgn(A)·x, sgn(A)·clip(x)) is one clamp per row: (−inf, ε_high] for A > 0,
    # [−ε_low, inf) for A < 0, {0} for A = 0 (the same values, negation being exact)
    zero = b.adv.new_zeros(())
    lo_log, hi_log = _sided_bounds(b, -b.eps_low, b.eps_high)
    at_zero = b.adv == 0
    kept = log_r.clamp(min=lo_log.where(~at_zero, zero), max=hi_log.where(~at_zero, zero))
    per_seq = -b.adv * sequence_log_ratio(kept, b.n_tokens).exp()
    lo, hi = _sided_bounds(b, math.exp(-b.eps_low), math.exp(b.eps_high))
    ratio = log_r.exp()
    return Surrogate(per_seq, ratio, lo, hi, log_r, ratio)


# =========================================================================== DPPO
def _dppo(b: Batch, divergence: Tensor, valid: Tensor, log_r: Tensor) -> Surrogate:
    """DPPO's loss (arXiv 2602.04879): −A·sg(min(r, c))·log π_θ on the tokens inside the divergence
    bound of their advantage's side, 0 elsewhere; c = dual_clip (verl's clip_ratio_c, 3.0)."""
    ratio = log_r.clamp(-VERL_LOG_RATIO_CLAMP, VERL_LOG_RATIO_CLAMP).exp()
    cap = VERL_RATIO_CAP if b.dual_clip is None else b.dual_clip
    weight = ratio.clamp(max=cap).detach()
    lo, hi = _sided_bounds(b, -b.eps_low, b.eps_high)
    per_token = -b.adv * weight * b.logp * valid.detach().to(b.logp.dtype)
    return Surrogate(per_token, divergence.detach(), lo, hi, log_r)


@register_objective("dppo_tv", aggregation="token-mean", capacity="prob_diff")
def dppo_tv(b: Batch) -> Surrogate:
    """DPPO binary-TV (arXiv 2602.04879) as verl 0.9.1: a token trains while π_θ − π_old ≤ δ_high
    (A > 0) or ≥ −δ_low (A ≤ 0), δ = ``epsilon_high``/``epsilon`` as probabilities; token-mean."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    diff = b.logp.exp() - b.old_logp.exp()
    valid = (diff <= b.eps_high).where(b.adv > 0, diff >= -b.eps_low)
    return _dppo(b, diff, valid, log_r)


def binary_kl(p_old: Tensor, old_logp: Tensor, p: Tensor, logp: Tensor) -> Tensor:
    """DPPO (arXiv 2602.04879): the KL of the Bernoulli (π_old, 1 − π_old) to (π, 1 − π),
    π_old·(log π_old − log π) + (1 − π_old)·log((1 − π_old + 1e-8)/(1 − π + 1e-8)), as verl."""
    return p_old * (old_logp - logp) + (1 - p_old) * ((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8)).log()


@register_objective("dppo_kl", aggregation="token-mean", capacity="binary_kl")
def dppo_kl(b: Batch) -> Surrogate:
    """DPPO binary-KL (arXiv 2602.04879) as verl 0.9.1: a token trains while the binary KL from
    π_old is ≤ δ_high (A > 0, or π_θ ≤ π_old) / ≤ δ_low (A ≤ 0, or π_θ ≥ π_old); token-mean."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    p, p_old = b.logp.exp(), b.old_logp.exp()
    kl = binary_kl(p_old, b.old_logp, p, b.logp)
    valid = ((kl <= b.eps_high) | (p <= p_old)).where(b.adv > 0, (kl <= b.eps_low) | (p >= p_old))
    signed = kl.where(p > p_old, -kl)  # > δ_high / < −δ_low exactly where a token is dropped
    return _dppo(b, signed, valid, log_r)


# =========================================================================== covariance remedies
def _token_mean(x: Tensor, b: Batch) -> Tensor:
    """verl's masked_mean: Σ x·m / (Σ m + 1e-8)."""
    return (x * b.mask_f).sum() / (b.mask_f.sum() + 1e-8)


@register_objective("clip_cov", aggregation="token-mean", capacity="clipped",
                    params={"clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0})
def clip_cov(b: Batch) -> Surrogate:
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617, Eq. 11) as verl 0.9.1: the PPO surrogate, with
    the gradient of a random ``clip_cov_ratio`` share of this micro-batch's tokens (drawn from the
    global torch RNG, as verl) stopped among those not clipped whose centred covariance
    (A − mean A)·(log π_θ − mean log π_θ) lies in (``clip_cov_lb``, ``clip_cov_ub``)."""
    import torch

    log_r = token_log_ratio(b.logp, b.old_logp)
    ratio = log_r.exp()
    lo, hi = clip_bounds(b.adv, eps_low=b.eps_low, eps_high=b.eps_high, dual_clip=b.dual_clip)
    per_token = clipped_surrogate(ratio, b.adv, lo, hi)
    with torch.no_grad():
        adv = b.adv.expand_as(b.logp)
        origin = -adv * ratio.clamp(1.0 - b.eps_low, 1.0 + b.eps_high) > -adv * ratio
        logp = b.logp.detach()
        cov = (adv - _token_mean(adv, b)) * (logp - _token_mean(logp, b))
        candidates = (cov < float(b.params["clip_cov_ub"])) & (cov > float(b.params["clip_cov_lb"])) \
            & b.mask & ~origin
        n_clip = max(int(float(b.params["clip_cov_ratio"]) * b.mask_f.sum().item()), 1)
        idx = torch.nonzero(candidates)
        keep = torch.ones_like(per_token)
        if len(idx):
            idx = idx[torch.randperm(len(idx))[:min(n_clip, len(idx))]]
            keep[idx[:, 0], idx[:, 1]] = 0.0
    return Surrogate(per_token * keep, ratio, lo, hi, log_r, ratio)


@register_objective("kl_cov", aggregation="token-mean", capacity="unbounded",
                    params={"kl_cov_ratio": 2e-4, "ppo_kl_coef": 0.1})
def kl_cov(b: Batch) -> Surrogate:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617, Eq. 12) as verl 0.9.1: −A·r_t unclipped, plus
    ``ppo_kl_coef``·|log r_t| on the top ``kl_cov_ratio`` share (at least one) of this
    micro-batch's tokens by centred covariance (A − mean A)·(log π_θ − mean log π_θ)."""
    import torch

    log_r = token_log_ratio(b.logp, b.old_logp)
    ratio = log_r.exp()
    plain = -b.adv * ratio
    penalised = -b.adv * ratio + float(b.params["ppo_kl_coef"]) * log_r.abs()
    with torch.no_grad():
        valid = b.mask.reshape(-1).nonzero(as_tuple=True)[0]
        chosen = torch.zeros_like(b.mask.reshape(-1))
        if len(valid):
            adv = b.adv.expand_as(b.logp).reshape(-1)[valid]
            logp = b.logp.detach().reshape(-1)[valid]
            cov = (adv - adv.mean()) * (logp - logp.mean())
            k = max(1, int(len(cov) * float(b.params["kl_cov_ratio"])))
            chosen[valid[torch.topk(cov, k, largest=True).indices]] = True
    return _unclipped(b, penalised.where(chosen.reshape(b.mask.shape), plain), log_r, ratio)


# =========================================================================== plain policy gradients
@register_objective("gpg", aggregation="token-mean", capacity="unbounded")
def gpg(b: Batch) -> Surrogate:
    """GPG (Chu et al. 2025, arXiv 2504.02546, Eq. 4) as verl 0.9.1: −log π_θ·A, no ratio, no clip;
    token-mean (GPG's own advantage estimator is not part of the loss)."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    return _unclipped(b, -b.logp * b.adv, log_r, log_r.exp())


@register_objective("dro", aggregation="token-mean", capacity="unbounded", params={"dro_beta": None})
def dro(b: Batch) -> Surrogate:
    """DRO as verl 0.9.1 (``compute_policy_loss_dro``): −(log π_θ·A − ½·β·(log r_t)²), β =
    ``dro_beta`` (required, > 0: verl has no default); a quadratic pull to π_old, no clip; token-mean."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    per_token = -(b.logp * b.adv - 0.5 * float(b.params["dro_beta"]) * log_r.square())
    return _unclipped(b, per_token, log_r, log_r.exp())


# =========================================================================== TRL's other loss types
@register_objective("bnpo", aggregation="token-mean", capacity="clipped")
def bnpo(b: Batch) -> Surrogate:
    """BNPO as TRL 1.16's ``loss_type="bnpo"``: the GRPO surrogate; token-mean (TRL divides by the
    micro-batch's tokens, armorlab by the generation batch's: equal at GA 1 on one process)."""
    return token_clipped(b)


@register_objective("luspo", aggregation="seq-mean-token-sum", capacity="clipped", sequence_level=True)
def luspo(b: Batch) -> Surrogate:
    """LUSPO as TRL 1.16's ``loss_type="luspo"`` (sequence level): GSPO's clipped sequence ratio,
    each sequence's loss scaled by its length — Σ_t ℓ_i per sequence, mean over sequences."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    return clipped(b, sequence_log_ratio(log_r, b.n_tokens).exp(), plain_log_ratio=log_r)


VESPO_LOG_W = (math.log(1e-8), 20.0)  # TRL's clamp of the sequence log-weight


@register_objective("vespo", aggregation="token-mean", capacity="unbounded",
                    params={"vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0,
                            "vespo_lambda_neg": 2.0})
def vespo(b: Batch) -> Surrogate:
    """VESPO as TRL 1.16's ``loss_type="vespo"``: −sg(φ(w_i))·A·log π_θ with the sequence weight
    w_i = exp(Σ_t clamp(log r_t, ±20)) (clamped to [1e-8, e^20]) and φ(w) = e^λ·w^k·e^(−λw)
    (k, λ: ``vespo_k_pos/lambda_pos`` for A ≥ 0, ``_neg`` below); token-mean."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    log_w = log_r.clamp(-20.0, 20.0).sum(-1, keepdim=True).clamp(*VESPO_LOG_W).detach()
    nonneg = b.adv >= 0
    k = b.adv.new_tensor(float(b.params["vespo_k_pos"])).where(nonneg, b.adv.new_tensor(float(b.params["vespo_k_neg"])))
    lam = b.adv.new_tensor(float(b.params["vespo_lambda_pos"])).where(
        nonneg, b.adv.new_tensor(float(b.params["vespo_lambda_neg"]))).clamp(min=1e-4)
    phi = (lam + k * log_w - lam * log_w.exp()).exp().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return _unclipped(b, -phi * b.adv * b.logp, log_r, log_r.exp())
