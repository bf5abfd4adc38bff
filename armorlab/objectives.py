"""Policy objectives as pure torch functions: ratios, clipped surrogates, aggregation, capacity.

No trainer, no I/O. The public entry points are ``policy_loss``, ``probability_capacity`` and
``capacity_summary``; everything else is one equation per function so tests can pin each one.

Conventions (shapes: logp, old_logp, ref_logp, mask are (B, T); advantages is (B,)):

* Every objective is ``per-token loss = −A · clamp(ratio, lo, hi)`` for some ratio and per-row
  bounds (``clip_bounds``). This single form is the PPO ``−min(r·A, clip(r)·A)`` (for A > 0 it
  is −A·min(r, 1+ε_high), for A < 0 −A·max(r, 1−ε_low)), plus verl's dual clip as an upper bound
  c for A < 0, plus UP's unbounded positive branch as infinite bounds. ``torch.clamp`` passes no
  gradient where a bound binds, so "zero gradient exactly where a clip binds" holds by
  construction, and no objective pays for a min over two surrogates.
* Masked positions are replaced by 0 with ``torch.where`` *before* any exp/logaddexp, so NaN or
  ±inf there can influence neither the loss nor the gradient (``x·0`` would give NaN for inf,
  and NaN gradients leak through ``where`` unless its input is already clean).
* Sequence objectives (gspo, up_gspo) have one loss ℓ_i per sequence. ``per_token`` carries ℓ_i
  on each unmasked token of row i (broadcast, as TRL's importance_sampling_level="sequence"
  does), so for every objective ``loss == aggregate(per_token)``: the default ``seq-mean`` (the
  mean over rows of the row's token mean) is then exactly mean_i ℓ_i, each sequence counted
  once, and ``token-mean`` weights each sequence by its length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from armorlab import capacity as _cap
from armorlab.errors import ArmorLabError

SEQUENCE_OBJECTIVES = ("gspo", "up_gspo")


@dataclass(frozen=True)
class LossOutput:
    """``loss`` 0-dim tensor; ``per_token`` (B, T), 0 where masked; ``metrics`` python floats."""

    loss: torch.Tensor
    per_token: torch.Tensor
    metrics: dict[str, float]


# =========================================================================== ratios
def token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """log r_t = log π_θ − log π_old, the token importance ratio r_t(θ) of PPO
    (Schulman et al. 2017, defined with Eq. 6) used by GRPO/DAPO/Dr.GRPO."""
    return logp - old_logp


def sequence_log_ratio(log_ratio: torch.Tensor, n_tokens: torch.Tensor) -> torch.Tensor:
    """GSPO (Zheng et al. 2025, §4.1): log s_i = (1/|y_i|)·Σ_t log(π_θ/π_old), the log of the
    length-normalised sequence ratio s_i = (π_θ(y_i|x)/π_old(y_i|x))^(1/|y_i|). Returns (B, 1).

    ``log_ratio`` must already be 0 at masked positions; ``n_tokens`` is |y_i| clamped to ≥ 1.
    """
    return (log_ratio.sum(-1) / n_tokens).unsqueeze(-1)


def up_denominator(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """UP (arXiv 2607.06987): the ratio's denominator is sg(π_θ) where A > 0, π_old elsewhere (log space).

    On A > 0 rows the ratio is π_θ/sg(π_θ): value exactly 1 (log π − sg(log π) = 0), gradient
    ∇log π_θ, independent of π_old; A ≤ 0 rows keep the plain ratio π_θ/π_old.
    ``advantages`` is (B, 1).
    """
    return torch.where(advantages > 0, logp.detach(), old_logp)


# Below this, every plain ratio r and the weight w are represented well enough in float32 for
# w·r + (1 − w) to be as exact as the log-space form (see mixed_ratio).
LINEAR_MIX_LIMIT = 1e26


def mixed_ratio(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor,
                alpha: float | torch.Tensor, *, plain_ratio: torch.Tensor | None = None) -> torch.Tensor:
    """ARMOR's mixed importance ratio (the r_mix whose r_mix = 1 ± ε solution is Eq. 6):

    r_mix = (α·π_θ + (1−α)·π_ref) / (α·π_old + (1−α)·π_ref)
          = w·(π_θ/π_old) + (1 − w),   w = α·π_old / (α·π_old + (1−α)·π_ref)   (ARMOR §4.2).

    w is the sigmoid of the log-odds log(α·π_old) − log((1−α)·π_ref), so it is never 0/0 however
    small the probabilities. The gradient, w·r·∇log π_θ (w on policy: Δmix = α·Δθ when
    π_ref = π_old), flows only through π_θ.

    Two evaluations of the same equation:
    * log space (always correct): exp(log π_θ − log D) + (1 − w), with
      log D = log(π_old + (1−α)/α·π_ref) = logaddexp(log π_old, log π_ref + log((1−α)/α)) —
      the issue's logaddexp(log α + log π_θ, log(1−α) + log π_ref) − logaddexp(... π_old ...)
      with the constant log α moved out. Finite for log-probs down to −1e4, where π underflows.
    * linear, given ``plain_ratio`` = exp(log π_θ − log π_old) carrying the gradient:
      1 + w·(r − 1) = lerp(1, r, w) in one fused op. It reuses the plain ratio the caller has
      (and needs for its metrics) instead of a logaddexp and a second exp, and is used only while
      every r < LINEAR_MIX_LIMIT: nothing overflows then, and where w is too small for float32 to
      store it precisely (< 1.2e-38) its term w·(r − 1) < 1e-12 does not matter; where w ≥ ½ lerp
      evaluates r − (r − 1)·(1 − w) (1 − w rounded: absolute error ≤ 6e-8). A batch with a bigger
      or non-finite ratio uses log space.
    At α = 1, w = 1 exactly and 1 − w = 0, so both give the plain ratio bit for bit.
    """
    alpha = torch.as_tensor(alpha, dtype=logp.dtype, device=logp.device)
    log_odds_alpha = torch.log(alpha) - torch.log1p(-alpha)  # log(α/(1−α)), +inf at α = 1
    with torch.no_grad():
        if plain_ratio is not None and bool(plain_ratio.detach().sum() < LINEAR_MIX_LIMIT):
            # In place on our own temporaries: these passes run on every token of the batch.
            weight = (old_logp - ref_logp).add_(log_odds_alpha).sigmoid_()   # w
            linear = True
        else:
            ref_term = ref_logp - log_odds_alpha                  # log((1−α)/α·π_ref)
            log_den = torch.logaddexp(old_logp, ref_term)
            ref_share = ref_term.sub_(old_logp).sigmoid_()        # 1 − w
            linear = False
    if linear:
        assert plain_ratio is not None
        # lerp(1, r, w) = 1 + w·(r − 1), evaluated as r − (r − 1)·(1 − w) where w ≥ ½: one pass
        # instead of forming 1 − w first; at w = 1 it is r bit for bit
        return torch.lerp(plain_ratio.new_ones(()), plain_ratio, weight)
    return torch.exp(logp - log_den) + ref_share


# =========================================================================== clipped surrogate
def clip_bounds(advantages: torch.Tensor, *, eps_low: float, eps_high: float, dual_clip: float | None,
                unbounded_positive: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row ratio bounds (lo, hi), shape like ``advantages``, for ``clipped_surrogate``.

    A > 0: (−inf, 1+ε_high)  — DAPO clip-higher (Yu et al. 2025); (−inf, +inf) for UP's branch.
    A ≤ 0: (1−ε_low, c)      — c = dual_clip (Ye et al. 2020 dual-clip PPO, as in verl's
                              ``compute_policy_loss``), +inf when off.
    """
    pos = advantages > 0
    inf = math.inf
    hi_pos = inf if unbounded_positive else 1.0 + eps_high
    lo_pos = -inf
    hi_neg = inf if dual_clip is None else float(dual_clip)
    lo = torch.where(pos, advantages.new_tensor(lo_pos), advantages.new_tensor(1.0 - eps_low))
    hi = torch.where(pos, advantages.new_tensor(hi_pos), advantages.new_tensor(hi_neg))
    return lo, hi


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, lo: torch.Tensor,
                      hi: torch.Tensor) -> torch.Tensor:
    """PPO clipped surrogate (Schulman et al. 2017, Eq. 7) as a loss, with verl's dual clip:

    ℓ = −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A), capped at −A·c for A < 0
      = −A·clamp(r, lo, hi) with (lo, hi) from ``clip_bounds``.

    ``advantages`` and the bounds broadcast against ``ratio`` ((B, 1) against (B, T) or (B, 1)).
    """
    return -advantages * ratio.clamp(min=lo, max=hi)


# =========================================================================== aggregations
# Each aggregation is a sum over the batch divided by a count: ``(numerator, count)`` below, the
# division in ``aggregate``. Keeping them apart is what lets a caller divide by a count gathered
# over a whole generation batch (every process and accumulation step) instead of this batch's.
def token_mean(per_token: torch.Tensor, mask_f: torch.Tensor, max_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """DAPO token-level loss (Yu et al. 2025, §3.3): Σ_i Σ_t ℓ_i,t over unmasked tokens / their count."""
    return per_token.sum(), mask_f.sum()


def seq_mean_token_mean(per_token: torch.Tensor, mask_f: torch.Tensor,
                        max_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, Eq. 3): (1/G)·Σ_i (1/|o_i|)·Σ_t ℓ_i,t; G counts non-empty rows.

    Also ``seq-mean``: with sequence objectives ℓ_i,t = ℓ_i on every token, so this is
    mean_i ℓ_i, each sequence counted once (GSPO §4.1).
    """
    n_tok = mask_f.sum(-1)
    return (per_token.sum(-1) / n_tok.clamp(min=1.0)).sum(), _rows(n_tok)


def seq_mean_token_sum(per_token: torch.Tensor, mask_f: torch.Tensor,
                       max_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(1/G)·Σ_i Σ_t ℓ_i,t: sum per sequence, mean over non-empty sequences."""
    return per_token.sum(), _rows(mask_f.sum(-1))


def seq_mean_token_sum_norm(per_token: torch.Tensor, mask_f: torch.Tensor,
                            max_len: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", Eq. 3 as a loss):
    (1/G)·Σ_i Σ_t ℓ_i,t / L_max, a constant normaliser instead of each response's length."""
    assert max_len is not None  # validated in policy_loss
    return per_token.sum() / max_len, _rows(mask_f.sum(-1))


def _rows(tokens_per_row: torch.Tensor) -> torch.Tensor:
    """Rows with at least one unmasked token: a gated or fully masked row is no sequence at all
    (verl's ``agg_loss`` counts the same way), so it cannot dilute a seq-mean."""
    return torch.count_nonzero(tokens_per_row).to(tokens_per_row.dtype)


AGGREGATORS: dict[str, Callable[[torch.Tensor, torch.Tensor, int | None], tuple[torch.Tensor, torch.Tensor]]] = {
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
    "seq-mean": seq_mean_token_mean,
}
# What each aggregation divides by: unmasked tokens, or non-empty rows.
AGGREGATION_UNIT = {name: "tokens" if name == "token-mean" else "rows" for name in AGGREGATORS}


def aggregate(per_token: torch.Tensor, mask_f: torch.Tensor, aggregation: str, max_len: int | None,
              normalizer: float | torch.Tensor | None = None) -> torch.Tensor:
    """L = S / ν (verl's ``agg_loss`` with its global batch info): S is the aggregation's sum
    over this batch (``AGGREGATORS``), ν its own count (tokens or non-empty rows), or
    ``normalizer`` when given: the count of the whole batch this one is a part of, so that the
    parts' losses add up to the whole's, L·ν = S exactly (ν > 0). With its own count, an empty
    batch gives 0, not NaN.
    """
    numerator, count = AGGREGATORS[aggregation](per_token, mask_f, max_len)
    if normalizer is None:
        return numerator / count.clamp(min=1.0)
    return numerator / torch.as_tensor(normalizer, dtype=numerator.dtype, device=numerator.device)


# =========================================================================== objectives
@dataclass(frozen=True)
class _Batch:
    """Inputs after validation, with masked positions already replaced by 0."""

    logp: torch.Tensor          # (B, T), carries the gradient
    old_logp: torch.Tensor      # (B, T)
    ref_logp: torch.Tensor | None
    adv: torch.Tensor           # (B, 1)
    mask: torch.Tensor          # (B, T) bool
    mask_f: torch.Tensor        # (B, T) float
    n_valid: torch.Tensor       # (B,) unmasked tokens per row
    n_tokens: torch.Tensor      # (B,) the same, clamped to ≥ 1 (a divisor)
    alpha: torch.Tensor         # 0-dim or broadcastable to (B, T)
    eps_low: float
    eps_high: float
    dual_clip: float | None


@dataclass(frozen=True)
class _Surrogate:
    """What an objective hands back: its per-token loss, plus what the metrics reuse."""

    per_token: torch.Tensor     # (B, T) or (B, 1) for sequence objectives, not yet masked
    ratio: torch.Tensor         # the ratio the objective clips, shaped like per_token
    lo: torch.Tensor            # (B, 1) bounds from clip_bounds
    hi: torch.Tensor
    plain_log_ratio: torch.Tensor | None  # log π_θ − log π_old (B, T), when already computed
    plain_ratio: torch.Tensor | None      # its exp, when already computed


def _clipped(b: _Batch, ratio: torch.Tensor, *, unbounded_positive: bool = False,
             plain_log_ratio: torch.Tensor | None = None, plain_ratio: torch.Tensor | None = None) -> _Surrogate:
    lo, hi = clip_bounds(b.adv, eps_low=b.eps_low, eps_high=b.eps_high, dual_clip=b.dual_clip,
                         unbounded_positive=unbounded_positive)
    return _Surrogate(clipped_surrogate(ratio, b.adv, lo, hi), ratio, lo, hi, plain_log_ratio, plain_ratio)


def _token_clipped(b: _Batch) -> _Surrogate:
    """The PPO clipped surrogate on the token ratio r_t; the three objectives below differ only in
    ε defaults and aggregation."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    ratio = torch.exp(log_r)
    return _clipped(b, ratio, plain_log_ratio=log_r, plain_ratio=ratio)


def _grpo(b: _Batch) -> _Surrogate:
    """GRPO (Shao et al. 2024, Eq. 3): −min(r_t·A, clip(r_t, 1−ε, 1+ε)·A) per token; seq-mean-token-mean."""
    return _token_clipped(b)


def _dapo(b: _Batch) -> _Surrogate:
    """DAPO (Yu et al. 2025): the same surrogate with decoupled ε_low/ε_high; token-mean."""
    return _token_clipped(b)


def _dr_grpo(b: _Batch) -> _Surrogate:
    """Dr. GRPO (Liu et al. 2025): the same surrogate; sum per sequence / L_max (seq-mean-token-sum-norm)."""
    return _token_clipped(b)


def _gspo(b: _Batch) -> _Surrogate:
    """GSPO (Zheng et al. 2025, §4.1): −min(s_i·A_i, clip(s_i)·A_i), one loss per sequence."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    return _clipped(b, torch.exp(sequence_log_ratio(log_r, b.n_tokens)), plain_log_ratio=log_r)


def _up(b: _Batch) -> _Surrogate:
    """UP (arXiv 2607.06987): A > 0 → −A·π_θ/sg(π_θ) unclipped; A ≤ 0 → the dapo surrogate."""
    log_r = token_log_ratio(b.logp, up_denominator(b.logp, b.old_logp, b.adv))
    return _clipped(b, torch.exp(log_r), unbounded_positive=True)


def _up_gspo(b: _Batch) -> _Surrogate:
    """UP on GSPO: A > 0 → −A·exp(mean_t(log π_θ − sg(log π_θ))) unclipped; A ≤ 0 → gspo."""
    log_r = token_log_ratio(b.logp, up_denominator(b.logp, b.old_logp, b.adv))
    return _clipped(b, torch.exp(sequence_log_ratio(log_r, b.n_tokens)), unbounded_positive=True)


def _armor(b: _Batch) -> _Surrogate:
    """ARMOR (arXiv 2607.10481): PPO Eq. 7 with DAPO's clip on r_mix (``mixed_ratio``)."""
    assert b.ref_logp is not None  # validated in policy_loss
    log_r = token_log_ratio(b.logp, b.old_logp)
    ratio = torch.exp(log_r)
    r_mix = mixed_ratio(b.logp, b.old_logp, b.ref_logp, b.alpha, plain_ratio=ratio)
    return _clipped(b, r_mix, plain_log_ratio=log_r, plain_ratio=ratio)


OBJECTIVES: dict[str, Callable[[_Batch], _Surrogate]] = {
    "grpo": _grpo,
    "dapo": _dapo,
    "dr_grpo": _dr_grpo,
    "gspo": _gspo,
    "up": _up,
    "up_gspo": _up_gspo,
    "armor": _armor,
}
DEFAULT_AGGREGATION = {
    "grpo": "seq-mean-token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "gspo": "seq-mean",
    "up": "token-mean",
    "up_gspo": "seq-mean",
    "armor": "token-mean",
}


# =========================================================================== validation
def _fail(message: str, key: str, value: Any) -> ArmorLabError:
    return ArmorLabError(message, key=key, value=value)


def _check_objective(objective: Any, known: dict[str, Any]) -> None:
    if not isinstance(objective, str) or objective not in known:
        raise _fail(f"unknown objective (known: {', '.join(known)})", "objective", objective)


def _check_eps(eps_low: Any, eps_high: Any) -> None:
    for key, value in (("eps_low", eps_low), ("eps_high", eps_high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0:
            raise _fail("must be a finite number ≥ 0", key, value)


def _alpha_tensor(alpha: Any, objective: str, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """α as a tensor on ``like``'s device/dtype; a float, a 0-dim tensor or one broadcastable to (B, T)."""
    if alpha is None:
        if objective == "armor":
            raise _fail("armor needs alpha in (0, 1]", "alpha", alpha)
        alpha = 1.0
    if isinstance(alpha, torch.Tensor):
        # 2-D only: a 1-D (B,) tensor would silently broadcast along T instead of per row.
        if alpha.dim() not in (0, 2) and alpha.numel() != 1:
            raise _fail(f"alpha tensor must be 0-dim or 2-D broadcastable to {tuple(shape)} "
                        "(give per-row α as shape (B, 1))", "alpha", tuple(alpha.shape))
        try:
            if torch.broadcast_shapes(alpha.shape, shape) != shape:
                raise RuntimeError
        except RuntimeError:
            raise _fail(f"alpha tensor does not broadcast to {tuple(shape)}", "alpha",
                        tuple(alpha.shape)) from None
        alpha_t = alpha.detach().to(device=like.device, dtype=like.dtype)
        bad = ~((alpha_t > 0) & (alpha_t <= 1))
        if bool(bad.any()):
            raise _fail("every value must be in (0, 1]", "alpha", float(alpha_t[bad].flatten()[0]))
        return alpha_t
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (0.0 < alpha <= 1.0):
        raise _fail("must be in (0, 1]", "alpha", alpha)
    return torch.tensor(float(alpha), device=like.device, dtype=like.dtype)


def _check_tensor(name: str, t: Any, shape: torch.Size | None) -> None:
    if not isinstance(t, torch.Tensor):
        raise _fail("must be a torch.Tensor", name, type(t).__name__)
    if shape is not None and t.shape != shape:
        raise _fail(f"shape mismatch: expected {tuple(shape)}", name, tuple(t.shape))


def _check_batch(name: str, lead: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor) -> torch.Size:
    """``lead`` (B, T) sets the shape old_logp and mask must have, and advantages must be (B,)."""
    _check_tensor(name, lead, None)
    if lead.dim() != 2:
        raise _fail("must be 2-D (B, T)", name, tuple(lead.shape))
    shape = lead.shape
    _check_tensor("old_logp", old_logp, shape)
    _check_tensor("mask", mask, shape)
    _check_tensor("advantages", advantages, torch.Size([shape[0]]))
    return shape


def _prepare(objective: str, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
             mask: torch.Tensor, ref_logp: torch.Tensor | None, alpha: Any, eps_low: float,
             eps_high: float, dual_clip: float | None) -> _Batch:
    shape = _check_batch("logp", logp, old_logp, advantages, mask)
    if objective == "armor" and ref_logp is None:
        raise _fail("armor needs ref_logp (the reference policy's log-probs)", "ref_logp", None)
    if ref_logp is not None:
        _check_tensor("ref_logp", ref_logp, shape)
    _check_eps(eps_low, eps_high)
    if dual_clip is not None and (isinstance(dual_clip, bool) or not isinstance(dual_clip, (int, float))
                                  or not dual_clip > 1.0):
        raise _fail("must be > 1 (or None to disable)", "dual_clip", dual_clip)
    if not logp.is_floating_point():
        raise _fail("must be a floating-point tensor", "logp", str(logp.dtype))
    # Half-precision log-probs (bf16 models) are computed on in float32: bf16 cannot even count
    # tokens past 256 exactly. The cast is differentiable, so the gradient comes back in bf16.
    if torch.finfo(logp.dtype).bits < 32:
        logp = logp.float()
    alpha_t = _alpha_tensor(alpha, objective, shape, logp)

    m = mask if mask.dtype == torch.bool else mask != 0
    zero = logp.new_zeros(())
    n_valid = torch.count_nonzero(m, dim=-1).to(logp.dtype)
    # A row without tokens may carry a NaN advantage (e.g. the std of an empty group); zero it
    # so a row that contributes nothing cannot turn the gradient into NaN through −A·(...).
    adv = torch.where(n_valid > 0, advantages.detach().to(logp.dtype), zero).unsqueeze(-1)
    # π_ref only matters to armor (and its capacity): don't pay for sanitising it otherwise.
    uses_ref = objective == "armor" and ref_logp is not None
    return _Batch(
        logp=torch.where(m, logp, zero),
        old_logp=torch.where(m, old_logp.detach().to(logp.dtype), zero),
        ref_logp=torch.where(m, ref_logp.detach().to(logp.dtype), zero) if uses_ref else None,
        adv=adv, mask=m, mask_f=m.to(logp.dtype), n_valid=n_valid, n_tokens=n_valid.clamp(min=1.0),
        alpha=alpha_t,
        eps_low=float(eps_low), eps_high=float(eps_high),
        dual_clip=None if dual_clip is None else float(dual_clip),
    )


# =========================================================================== metrics
def _count(flags: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, b: _Batch) -> torch.Tensor:
    """How many unmasked tokens of the selected rows have ``flags`` set.

    ``rows`` is the (B, 1) row selection and ``tokens`` the same selection already combined
    with the mask, (B, T). ``flags`` is (B, T), or (B, 1) for a sequence ratio, which then counts
    once per unmasked token. Boolean work only: several times cheaper than float passes.
    """
    if flags.shape[-1] == 1:
        return ((flags & rows).squeeze(-1) * b.n_valid).sum()
    return torch.count_nonzero(flags & tokens)


@torch.no_grad()
def _metrics(objective: str, b: _Batch, s: _Surrogate) -> dict[str, float]:
    """Token-weighted over unmasked tokens. Clip fractions count only the side that can bind
    for the token's advantage sign: the upper clip for A > 0; the lower and the dual clip for
    A < 0; none at A = 0 (no gradient to stop)."""
    n = b.n_valid.sum().clamp(min=1.0)
    pos, neg = b.adv > 0, b.adv < 0
    pos_tok, neg_tok = b.mask & pos, b.mask & neg
    ratio = s.ratio.detach()
    above, below = ratio > s.hi, ratio < s.lo
    counts = [_count(below, neg, neg_tok, b), _count(above, pos, pos_tok, b),
              _count(above, neg, neg_tok, b) if b.dual_clip is not None else n.new_zeros(())]
    names = ["clip_frac_low", "clip_frac_high", "dual_clip_frac"]
    flat_mask = b.mask_f.flatten()
    if s.plain_log_ratio is not None:
        log_r = s.plain_log_ratio.detach()
        kl_sum = -log_r.sum()
        plain = s.plain_ratio.detach() if s.plain_ratio is not None else torch.exp(log_r)
    else:
        log_r = token_log_ratio(b.logp, b.old_logp)
        kl_sum = -log_r.sum()
        plain = log_r.exp_()  # our own temporary, no longer needed as a log
    # log_r is exactly 0 at masked positions, so its plain sum is the masked sum.
    counts += [torch.dot(plain.flatten(), flat_mask), kl_sum]
    names += ["ratio_mean", "approx_kl"]
    if objective == "armor":
        # r_mix lies between 1 and r, so "r_mix inside the clip range while r is clipped" is
        # "the plain ratio's clip binds" minus "the mixed ratio's clip binds" (same bounds,
        # the latter already counted above). Multiplying by sign(A) turns both sides into one
        # comparison: A > 0 binds at r > hi, A < 0 at −r > −lo (and at r > c with a dual clip).
        sign = torch.sign(b.adv)
        threshold = torch.where(pos, s.hi, torch.where(neg, -s.lo, s.lo.new_tensor(math.inf)))
        plain_binds = _count((plain * sign) > threshold, pos | neg, pos_tok | neg_tok, b)
        if b.dual_clip is not None:
            plain_binds = plain_binds + _count(plain > s.hi, neg, neg_tok, b)
        counts += [torch.dot(ratio.flatten(), flat_mask), plain_binds - counts[0] - counts[1] - counts[2]]
        names += ["mix_ratio_mean", "widened_frac"]
    values = (torch.stack([x.to(n.dtype) for x in counts]) / n).tolist()
    if not bool(b.n_valid.sum() > 0):  # every token masked: token means are undefined, not 0
        values = [math.nan] * len(values)
    out = dict(zip(names, values, strict=True))
    out["clip_frac"] = out["clip_frac_low"] + out["clip_frac_high"] + out["dual_clip_frac"]
    return out


# =========================================================================== public API
def policy_loss(objective: str, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, ref_logp: torch.Tensor | None = None, alpha: Any = 1.0,
                eps_low: float = 0.2, eps_high: float = 0.28, dual_clip: float | None = None,
                aggregation: str | None = None, max_len: int | None = None,
                normalizer: float | torch.Tensor | None = None) -> LossOutput:
    """The policy-gradient loss of ``objective`` on one (micro-)batch.

    ``alpha`` (armor only) is a float or a tensor broadcastable to (B, T) — per-row α as (B, 1) —
    with every value in (0, 1]; ``None`` means "not used" for objectives other than armor.
    ``aggregation`` overrides the objective's default (``DEFAULT_AGGREGATION``); ``max_len`` is
    required by ``seq-mean-token-sum-norm`` (dr_grpo's default). ``normalizer`` replaces this
    batch's own count (unmasked tokens for ``token-mean``, non-empty rows for the ``seq-mean-*``
    modes; ``AGGREGATION_UNIT``) by that of the whole batch this one is part of (see
    ``aggregate``): the loss is then this part's contribution to the whole's. Bad arguments raise
    ``ArmorLabError`` (a ValueError) naming the argument and its value.
    """
    _check_objective(objective, OBJECTIVES)
    aggregation = DEFAULT_AGGREGATION[objective] if aggregation is None else aggregation
    if aggregation not in AGGREGATORS:
        raise _fail(f"unknown aggregation (known: {', '.join(AGGREGATORS)})", "aggregation", aggregation)
    if aggregation == "seq-mean-token-sum-norm" and (
            isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise _fail(f"aggregation {aggregation!r} (objective {objective!r}) needs max_len, a positive int",
                    "max_len", max_len)
    b = _prepare(objective, logp, old_logp, advantages, mask, ref_logp, alpha, eps_low, eps_high, dual_clip)
    s = OBJECTIVES[objective](b)
    zero = logp.new_zeros(())
    per_token = torch.where(b.mask, s.per_token, zero)
    if normalizer is not None and not (isinstance(normalizer, torch.Tensor) and normalizer.numel() == 1) and (
            isinstance(normalizer, bool) or not isinstance(normalizer, (int, float)) or not normalizer > 0):
        raise _fail("must be a positive number or a one-element tensor (or None)", "normalizer", normalizer)
    loss = aggregate(per_token, b.mask_f, aggregation, max_len, normalizer)
    return LossOutput(loss=loss, per_token=per_token, metrics=_metrics(objective, b, s))


def probability_capacity(objective: str, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                         *, ref_logp: torch.Tensor | None = None, alpha: Any = 1.0, eps_low: float = 0.2,
                         eps_high: float = 0.28) -> torch.Tensor:
    """UP Eq. 11 / ARMOR Eq. 6 capacity per token, (B, T), 0 where masked (see armorlab.capacity)."""
    _check_objective(objective, OBJECTIVES)
    # There is no current policy here: old_logp stands in for logp in the shared validation.
    b = _prepare(objective, old_logp.detach(), old_logp, advantages, mask, ref_logp, alpha, eps_low,
                 eps_high, None)
    with torch.no_grad():
        p_ref = None if b.ref_logp is None else torch.exp(b.ref_logp)
        cap = _cap.token_capacity(objective, torch.exp(b.old_logp), torch.sign(b.adv), p_ref=p_ref,
                                  alpha=b.alpha, eps_low=b.eps_low, eps_high=b.eps_high)
        return torch.where(b.mask, cap, b.old_logp.new_zeros(()))


def capacity_summary(capacity: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """``pos_mean``, ``pos_bound_frac``, ``neg_mean`` over unmasked tokens (NaN when a side is empty)."""
    shape = _check_batch("capacity", capacity, old_logp, advantages, mask)
    with torch.no_grad():
        m = mask if mask.dtype == torch.bool else mask != 0
        p_old = torch.exp(torch.where(m, old_logp.detach(), old_logp.new_zeros(())))
        sign = torch.sign(advantages.detach()).unsqueeze(-1).expand(shape)
        return _cap.capacity_stats(capacity.detach(), p_old, sign, m.to(p_old.dtype))


def vllm_corrected_loss(per_token: torch.Tensor, is_ratio: torch.Tensor, mask: torch.Tensor, aggregation: str,
                        max_len: int, normalizer: Any = None) -> torch.Tensor:
    """TRL's vLLM importance-sampling correction on an armorlab loss: each token's loss × the
    (B, T) or (B, 1) ratio π_old/π_vLLM (clipped or masked by TRL), aggregated as the loss is
    (same aggregation, same normaliser). Anchor rows carry no sampler log-probs (NaN in TRL),
    so their ratio is exactly 1."""
    mask_f = (mask != 0).to(per_token.dtype)
    return aggregate(per_token * is_ratio.to(per_token.dtype), mask_f, aggregation, max_len, normalizer)
