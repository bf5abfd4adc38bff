"""The policy-gradient loss of any registered objective on one (micro-)batch: validation of the
inputs, the objective (``armorlab.algos.objectives``), the loss aggregations, the loss metrics and
probability capacity. Pure torch, no trainer, no I/O.

Masked positions are replaced by 0 with ``torch.where`` *before* the objective runs, so NaN or ±inf
there can influence neither the loss nor the gradient (``x·0`` would give NaN for inf, and NaN
gradients leak through ``where`` unless its input is already clean).

Sequence objectives (gspo, up_gspo) have one loss ℓ_i per sequence. ``per_token`` carries ℓ_i on
each unmasked token of row i (broadcast, as TRL's importance_sampling_level="sequence" does), so
for every objective ``loss == aggregate(per_token)``: the default ``seq-mean`` (the mean over rows
of the row's token mean) is then exactly mean_i ℓ_i, each sequence counted once, and
``token-mean`` weights each sequence by its length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from armorlab.algos import capacity as _cap
from armorlab.algos.objectives import (
    AGGREGATIONS,
    Batch,
    Surrogate,
    clip_bounds,
    clipped_surrogate,
    mixed_ratio,
    objective_names,
    objective_spec,
    sequence_log_ratio,
    token_log_ratio,
    up_denominator,
)
from armorlab.errors import ArmorLabError

# the equations, for code written against the pre-0.2 module armorlab.objectives (now this one)
__all__ = ["AGGREGATION_UNIT", "AGGREGATORS", "LossOutput", "aggregate", "capacity_summary", "clip_bounds",
           "clipped_surrogate", "mixed_ratio", "objective_params", "policy_loss", "probability_capacity", "sequence_log_ratio",
           "token_log_ratio", "up_denominator", "vllm_corrected_loss"]


@dataclass(frozen=True)
class LossOutput:
    """``loss`` 0-dim tensor; ``per_token`` (B, T), 0 where masked; ``metrics`` python floats."""

    loss: torch.Tensor
    per_token: torch.Tensor
    metrics: dict[str, float]


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
assert tuple(AGGREGATORS) == AGGREGATIONS  # the config layer checks names against objectives.AGGREGATIONS


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


# =========================================================================== validation
def _fail(message: str, key: str, value: Any) -> ArmorLabError:
    return ArmorLabError(message, key=key, value=value)


def _spec(objective: Any):
    known = objective_names()
    if not isinstance(objective, str) or objective not in known:
        raise _fail(f"unknown objective (known: {', '.join(known)})", "objective", objective)
    return objective_spec(objective)


def _check_eps(eps_low: Any, eps_high: Any) -> None:
    for key, value in (("eps_low", eps_low), ("eps_high", eps_high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0:
            raise _fail("must be a finite number ≥ 0", key, value)


def _alpha_tensor(alpha: Any, objective: str, uses_reference: bool, shape: torch.Size,
                  like: torch.Tensor) -> torch.Tensor:
    """α as a tensor on ``like``'s device/dtype; a float, a 0-dim tensor or one broadcastable to (B, T)."""
    if alpha is None:
        if uses_reference:
            raise _fail(f"{objective} needs alpha in (0, 1]", "alpha", alpha)
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


def objective_params(objective: str, given: Mapping[str, Any] | None) -> dict[str, float]:
    """The objective's parameters (``ObjectiveSpec.params``): its defaults, overridden by ``given``
    where not None; each must be a finite number (> 0 for a required one, default None)."""
    declared = objective_spec(objective).params
    given = dict(given or {})
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise _fail(f"not a parameter of objective {objective!r} (its parameters: "
                    f"{', '.join(declared) or 'none'})", unknown[0], given[unknown[0]])
    out = {}
    for key, default in declared.items():
        value = given.get(key) if given.get(key) is not None else default
        if value is None:
            raise _fail(f"objective {objective!r} needs {key}, a number > 0 (no default)", key, value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or (default is None and not value > 0):
            raise _fail("must be a finite number" + (" > 0" if default is None else ""), key, value)
        out[key] = float(value)
    return out


def _prepare(objective: str, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
             mask: torch.Tensor, ref_logp: torch.Tensor | None, alpha: Any, eps_low: float,
             eps_high: float, dual_clip: float | None, params: Mapping[str, float] | None = None) -> Batch:
    uses_reference = objective_spec(objective).uses_reference
    shape = _check_batch("logp", logp, old_logp, advantages, mask)
    if uses_reference and ref_logp is None:
        raise _fail(f"{objective} needs ref_logp (the reference policy's log-probs)", "ref_logp", None)
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
    alpha_t = _alpha_tensor(alpha, objective, uses_reference, shape, logp)

    m = mask if mask.dtype == torch.bool else mask != 0
    zero = logp.new_zeros(())
    n_valid = torch.count_nonzero(m, dim=-1).to(logp.dtype)
    # A row without tokens may carry a NaN advantage (e.g. the std of an empty group); zero it
    # so a row that contributes nothing cannot turn the gradient into NaN through −A·(...).
    adv = torch.where(n_valid > 0, advantages.detach().to(logp.dtype), zero).unsqueeze(-1)
    # π_ref only matters to objectives that read it (and their capacity): don't pay for sanitising it otherwise.
    uses_ref = uses_reference and ref_logp is not None
    return Batch(
        logp=torch.where(m, logp, zero),
        old_logp=torch.where(m, old_logp.detach().to(logp.dtype), zero),
        ref_logp=torch.where(m, ref_logp.detach().to(logp.dtype), zero) if uses_ref else None,
        adv=adv, mask=m, mask_f=m.to(logp.dtype), n_valid=n_valid, n_tokens=n_valid.clamp(min=1.0),
        alpha=alpha_t,
        eps_low=float(eps_low), eps_high=float(eps_high),
        dual_clip=None if dual_clip is None else float(dual_clip),
        params=dict(params or {}),
    )


# =========================================================================== metrics
def _count(flags: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, b: Batch) -> torch.Tensor:
    """How many unmasked tokens of the selected rows have ``flags`` set.

    ``rows`` is the (B, 1) row selection and ``tokens`` the same selection already combined
    with the mask, (B, T). ``flags`` is (B, T), or (B, 1) for a sequence ratio, which then counts
    once per unmasked token. Boolean work only: several times cheaper than float passes.
    """
    if flags.shape[-1] == 1:
        return ((flags & rows).squeeze(-1) * b.n_valid).sum()
    return torch.count_nonzero(flags & tokens)


def _decided(b: Batch, s: Surrogate, plain: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor,
             signed_tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens whose update the objective's ratio and clip decide otherwise than the plain clip would:
    (widened, narrowed, plain-stopped) counts. The plain clip is DAPO's: r = π_θ/π_old under (1 − ε_low, 1 + ε_high)
    and the dual clip; a token's update is stopped where the bound of its advantage's side binds
    (A > 0: above the upper; A < 0: below the lower or above c; A = 0 has no update). Widened: the
    plain clip would stop it, the objective lets it through (ARMOR's r_mix inside its bounds, UP's
    unbounded positive branch, a sequence ratio inside its bounds); narrowed: the reverse."""
    lo, hi = clip_bounds(b.adv, eps_low=b.eps_low, eps_high=b.eps_high, dual_clip=b.dual_clip)
    plain_stops = ((plain > hi) | (plain < lo)) & signed_tok
    ratio = s.ratio.detach()
    stops = ((ratio > s.hi) | (ratio < s.lo)) & (pos | neg)  # (B, T), or (B, 1) for a sequence ratio
    return (torch.count_nonzero(plain_stops & ~stops), torch.count_nonzero(stops & ~plain_stops & signed_tok),
            torch.count_nonzero(plain_stops))


@torch.no_grad()
def _metrics(objective: str, b: Batch, s: Surrogate) -> dict[str, float]:
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
    if objective_spec(objective).uses_reference:
        counts.append(torch.dot(ratio.flatten(), flat_mask))
        names.append("mix_ratio_mean")
    if s.ratio is s.plain_ratio:  # the plain ratio under the plain bounds: the same decisions
        counts += [n.new_zeros(()), n.new_zeros(()), counts[0] + counts[1] + counts[2]]
    else:
        counts += list(_decided(b, s, plain, pos, neg, pos_tok | neg_tok))
    names += ["widened_frac", "narrowed_frac", "plain_clip_frac"]
    values = (torch.stack([x.to(n.dtype) for x in counts]) / n).tolist()
    if not bool(b.n_valid.sum() > 0):  # every token masked: token means are undefined, not 0
        values = [math.nan] * len(values)
    out = dict(zip(names, values, strict=True))
    out["clip_frac"] = out["clip_frac_low"] + out["clip_frac_high"] + out["dual_clip_frac"]
    out["freed_frac"] = _cap.freed_share(out["widened_frac"], out["plain_clip_frac"])
    return out


# =========================================================================== public API
def policy_loss(objective: str, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, ref_logp: torch.Tensor | None = None, alpha: Any = 1.0,
                eps_low: float = 0.2, eps_high: float = 0.28, dual_clip: float | None = None,
                aggregation: str | None = None, max_len: int | None = None,
                normalizer: float | torch.Tensor | None = None,
                params: Mapping[str, Any] | None = None) -> LossOutput:
    """The policy-gradient loss of ``objective`` on one (micro-)batch.

    ``alpha`` (armor only) is a float or a tensor broadcastable to (B, T) — per-row α as (B, 1) —
    with every value in (0, 1]; ``None`` means "not used" for objectives other than armor.
    ``aggregation`` overrides the objective's default (its ``ObjectiveSpec.aggregation``); ``max_len`` is
    required by ``seq-mean-token-sum-norm`` (dr_grpo's default). ``normalizer`` replaces this
    batch's own count (unmasked tokens for ``token-mean``, non-empty rows for the ``seq-mean-*``
    modes; ``AGGREGATION_UNIT``) by that of the whole batch this one is part of (see
    ``aggregate``): the loss is then this part's contribution to the whole's. ``params`` are the
    objective's own parameters (``ObjectiveSpec.params``: SAPO's temperatures, Clip-Cov's ratio, ...),
    their defaults where absent or None. Bad arguments raise
    ``ArmorLabError`` (a ValueError) naming the argument and its value.
    """
    spec = _spec(objective)
    aggregation = spec.aggregation if aggregation is None else aggregation
    if aggregation not in AGGREGATORS:
        raise _fail(f"unknown aggregation (known: {', '.join(AGGREGATORS)})", "aggregation", aggregation)
    if aggregation == "seq-mean-token-sum-norm" and (
            isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise _fail(f"aggregation {aggregation!r} (objective {objective!r}) needs max_len, a positive int",
                    "max_len", max_len)
    b = _prepare(objective, logp, old_logp, advantages, mask, ref_logp, alpha, eps_low, eps_high, dual_clip,
                 objective_params(objective, params))
    s = spec.fn(b)
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
    """UP Eq. 11 / ARMOR Eq. 6 capacity per token, (B, T), 0 where masked (see armorlab.algos.capacity)."""
    _spec(objective)
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


def vllm_is_ratio(old_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor, mode: str,
                  clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """TRL's vLLM importance-sampling ratio (``vllm_importance_sampling_mode``), for rows scored after
    the filter: w = exp(log π_old − log π_vLLM) per token, (B, T), or per sequence, (B, 1), from the
    masked sum; a token vLLM did not score (NaN: anchors) adds 0. ``*_truncate`` clamps w to
    [clip_min, clip_max]; ``*_mask`` sets w outside it to 0."""
    diff = torch.nan_to_num((old_logp - sampling_logp) * mask, nan=0.0)
    ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)
