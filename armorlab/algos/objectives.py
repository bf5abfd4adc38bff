"""Policy objectives, one decorated function each, and the ratio equations they are built from.

Adding an objective is one function in one place::

    from armorlab import register_objective
    from armorlab.algos.objectives import Batch, Surrogate, clipped, token_log_ratio

    @register_objective("my_obj", aggregation="token-mean", capacity="clipped")
    def my_obj(b: Batch) -> Surrogate:
        \"\"\"My objective (Eq. 4 of my paper): the PPO surrogate on the token ratio.\"\"\"
        return clipped(b, token_log_ratio(b.logp, b.old_logp).exp())

The decorator records the objective's metadata (``ObjectiveSpec``) next to the function: the
default loss aggregation, whether it is sequence-level, its probability-capacity family, whether it
reads π_ref, and the config defaults it brings (its preset). The config layer reads that metadata
to validate ``objective:`` and fill defaults, and it must not import torch, so this module does not
either: every function here uses only the methods of the tensors it is given (``.exp()``,
``.where()``, ``.clamp()``, ...). ``armorlab.algos.loss`` (torch) validates a batch, calls the
objective and aggregates its per-token loss (``policy_loss``).

Conventions: logp, old_logp, ref_logp are (B, T) with masked positions already 0; advantages in a
``Batch`` are (B, 1). Every objective returns ``per-token loss = −A · clamp(ratio, lo, hi)``
(``clipped``): the PPO ``−min(r·A, clip(r)·A)`` as one clamp, verl's dual clip as an upper bound c
for A < 0, UP's unbounded positive branch as infinite bounds. A clamp passes no gradient where a
bound binds, so "zero gradient exactly where a clip binds" holds by construction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

# Loss aggregations (implemented in armorlab.algos.loss); named here so the config layer can check them.
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean")
# Probability-capacity families (armorlab.algos.capacity): the clip a token's probability meets.
CAPACITY_FAMILIES = ("clipped", "unbounded_positive", "mixed", "unbounded", "log_clipped", "prob_diff", "binary_kl")


@dataclass(frozen=True)
class Batch:
    """What an objective sees: one validated (micro-)batch, masked positions already 0."""

    logp: Tensor             # (B, T), carries the gradient
    old_logp: Tensor         # (B, T)
    ref_logp: Tensor | None  # (B, T), for objectives that read π_ref
    adv: Tensor              # (B, 1)
    mask: Tensor             # (B, T) bool
    mask_f: Tensor           # (B, T) the mask as floats
    n_valid: Tensor          # (B,) unmasked tokens per row
    n_tokens: Tensor         # (B,) the same, clamped to ≥ 1 (a divisor)
    alpha: Tensor            # 0-dim, or (B, 1)/(B, T): ARMOR's mixing weight
    eps_low: float
    eps_high: float
    dual_clip: float | None
    params: Mapping[str, Any] = field(default_factory=dict)  # the objective's own parameters (ObjectiveSpec.params)


@dataclass(frozen=True)
class Surrogate:
    """What an objective returns: its per-token loss and what the loss metrics reuse."""

    per_token: Tensor               # (B, T), or (B, 1) for sequence objectives; not yet masked
    ratio: Tensor                   # the ratio the objective clips, shaped like per_token
    lo: Tensor                      # (B, 1) bounds from clip_bounds
    hi: Tensor
    plain_log_ratio: Tensor | None = None  # log π_θ − log π_old (B, T), when already computed
    plain_ratio: Tensor | None = None      # its exp, when already computed


@dataclass(frozen=True)
class ObjectiveSpec:
    """An objective's function and the metadata the config, trainer and analysis read."""

    name: str
    fn: Callable[[Batch], Surrogate]
    aggregation: str                  # default loss aggregation (AGGREGATIONS)
    capacity: str                     # probability-capacity family (CAPACITY_FAMILIES)
    sequence_level: bool = False      # one loss per sequence, broadcast to its tokens
    uses_reference: bool = False      # reads π_ref (ref_logp) and α: ARMOR's mixed ratio
    defaults: Mapping[str, Any] = field(default_factory=dict)  # config defaults it brings (preset)
    # config keys it reads besides ε and their defaults (None: required); TRL's or verl's names
    params: Mapping[str, Any] = field(default_factory=dict)

    def clip(self) -> tuple[float, float]:
        """(ε_low, ε_high) a run of this objective has when its config sets neither: its preset's,
        else DEFAULT_EPS."""
        eps = {**DEFAULT_EPS, **{k: v for k, v in self.defaults.items() if k in DEFAULT_EPS}}
        return float(eps["epsilon"]), float(eps["epsilon_high"])

    @property
    def doc(self) -> str:
        """The first line of the function's docstring."""
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""


_REGISTRY: dict[str, ObjectiveSpec] = {}
DEFAULT_EPS = {"epsilon": 0.2, "epsilon_high": 0.28}  # DAPO's clip-higher: every objective's unless its preset


def default_alpha(num_generations: int) -> float:
    """α = (G−1)/G: the weight of the G−1 on-policy samples in a group that holds one anchor (ARMOR)."""
    return (num_generations - 1) / num_generations


def register_objective(name: str, *, aggregation: str, capacity: str, sequence_level: bool = False,
                       uses_reference: bool = False, defaults: Mapping[str, Any] | None = None,
                       params: Mapping[str, Any] | None = None, replace: bool = False) -> Callable[[Callable[[Batch], Surrogate]], Callable[[Batch], Surrogate]]:
    """Decorator: register ``fn(batch) -> Surrogate`` as objective ``name`` (as verl's
    ``register_policy_loss``). ``defaults`` are config values the objective brings when the user
    did not set them (e.g. GSPO's ε). ``params`` names the config keys the objective reads from
    ``Batch.params`` with their defaults (None: the user must give one). ``replace=True``
    re-registers a name."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"objective name must be an identifier, got {name!r}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
    if capacity not in CAPACITY_FAMILIES:
        raise ValueError(f"capacity must be one of {', '.join(CAPACITY_FAMILIES)}, got {capacity!r}")

    def decorate(fn: Callable[[Batch], Surrogate]) -> Callable[[Batch], Surrogate]:
        if name in _REGISTRY and not replace:
            raise ValueError(f"objective {name!r} is already registered (pass replace=True to replace it)")
        _REGISTRY[name] = ObjectiveSpec(name, fn, aggregation, capacity, sequence_level, uses_reference,
                                        MappingProxyType(dict(defaults or {})), MappingProxyType(dict(params or {})))
        return fn

    return decorate


def unregister_objective(name: str) -> None:
    """Remove objective ``name`` from the registry (a notebook or test that registered its own)."""
    _REGISTRY.pop(name, None)


def objective_names() -> tuple[str, ...]:
    """Every registered objective, in registration order (built-ins first)."""
    return tuple(_REGISTRY)


def objective_spec(name: str) -> ObjectiveSpec:
    """The metadata of objective ``name``; KeyError naming the known ones when there is none."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown objective {name!r} (known: {', '.join(_REGISTRY)})") from None


# =========================================================================== ratios
def token_log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """log r_t = log π_θ − log π_old, the token importance ratio r_t(θ) of PPO
    (Schulman et al. 2017, defined with Eq. 6) used by GRPO/DAPO/Dr.GRPO."""
    return logp - old_logp


def sequence_log_ratio(log_ratio: Tensor, n_tokens: Tensor) -> Tensor:
    """GSPO (Zheng et al. 2025, §4.1): log s_i = (1/|y_i|)·Σ_t log(π_θ/π_old), the log of the
    length-normalised sequence ratio s_i = (π_θ(y_i|x)/π_old(y_i|x))^(1/|y_i|). Returns (B, 1).

    ``log_ratio`` must already be 0 at masked positions; ``n_tokens`` is |y_i| clamped to ≥ 1.
    """
    return (log_ratio.sum(-1) / n_tokens).unsqueeze(-1)


def up_denominator(logp: Tensor, old_logp: Tensor, advantages: Tensor) -> Tensor:
    """UP (arXiv 2607.06987): the ratio's denominator is sg(π_θ) where A > 0, π_old elsewhere (log space).

    On A > 0 rows the ratio is π_θ/sg(π_θ): value exactly 1 (log π − sg(log π) = 0), gradient
    ∇log π_θ, independent of π_old; A ≤ 0 rows keep the plain ratio π_θ/π_old.
    ``advantages`` is (B, 1).
    """
    return logp.detach().where(advantages > 0, old_logp)


# Below this, every plain ratio r and the weight w are represented well enough in float32 for
# w·r + (1 − w) to be as exact as the log-space form (see mixed_ratio).
LINEAR_MIX_LIMIT = 1e26


def log_mixture(logp: Tensor, ref_logp: Tensor, alpha: Tensor | float) -> Tensor:
    """ARMOR (arXiv 2607.10481, §4.2): log(α·π + (1−α)·π_ref) per token, the mixed policy whose ratio
    is r_mix (numerator with π_θ, denominator with π_old). At α = 1 it is log π bit for bit."""
    if not hasattr(alpha, "log"):  # a plain number
        alpha = logp.new_tensor(float(alpha))
    return (logp + alpha.log()).logaddexp(ref_logp + (-alpha).log1p())


def mixed_ratio(logp: Tensor, old_logp: Tensor, ref_logp: Tensor, alpha: Tensor | float, *,
                plain_ratio: Tensor | None = None) -> Tensor:
    """ARMOR (arXiv 2607.10481, §4.2): the mixed importance ratio whose r_mix = 1 ± ε solution is Eq. 6,

    r_mix = (α·π_θ + (1−α)·π_ref) / (α·π_old + (1−α)·π_ref)
          = w·(π_θ/π_old) + (1 − w),   w = α·π_old / (α·π_old + (1−α)·π_ref).

    ``alpha`` is a number or a tensor in (0, 1] (0-dim or broadcastable to (B, T)); no gradient
    flows through α, π_old or π_ref. w is the sigmoid of the log-odds log(α·π_old) − log((1−α)·π_ref),
    so it is never 0/0 however small the probabilities. The gradient, w·r·∇log π_θ (w on policy:
    Δmix = α·Δθ when π_ref = π_old), flows only through π_θ.

    Two evaluations of the same equation:
    * log space (always correct): exp(log π_θ − log D) + (1 − w), with
      log D = log(π_old + (1−α)/α·π_ref) = log_mixture(log π_old, log π_ref, α) − log α.
      Finite for log-probs down to −1e4, where π underflows.
    * linear, given ``plain_ratio`` = exp(log π_θ − log π_old) carrying the gradient:
      1 + w·(r − 1) = lerp(1, r, w) in one fused op, used only while every r < LINEAR_MIX_LIMIT
      (nothing overflows; where w < 1.2e-38 its term w·(r − 1) < 1e-12 does not matter; where
      w ≥ ½ lerp evaluates r − (r − 1)·(1 − w), absolute error ≤ 6e-8). A batch with a bigger or
      non-finite ratio uses log space.
    At α = 1, w = 1 exactly and 1 − w = 0, so both give the plain ratio bit for bit.
    """
    if not hasattr(alpha, "log"):  # a plain number
        alpha = logp.new_tensor(float(alpha))
    alpha, old_logp, ref_logp = alpha.detach(), old_logp.detach(), ref_logp.detach()
    log_odds_alpha = alpha.log() - (-alpha).log1p()  # log(α/(1−α)), +inf at α = 1
    if plain_ratio is not None and bool(plain_ratio.detach().sum() < LINEAR_MIX_LIMIT):
        # in place on our own gradient-free temporaries: these passes run on every token of the batch
        weight = (old_logp - ref_logp).add_(log_odds_alpha).sigmoid_()   # w
        return plain_ratio.new_ones(()).lerp(plain_ratio, weight)
    log_den = log_mixture(old_logp, ref_logp, alpha) - alpha.log()
    ref_share = (ref_logp - log_odds_alpha).sub_(old_logp).sigmoid_()  # 1 − w
    return (logp - log_den).exp() + ref_share


# =========================================================================== clipped surrogate
def clip_bounds(advantages: Tensor, *, eps_low: float, eps_high: float, dual_clip: float | None,
                unbounded_positive: bool = False) -> tuple[Tensor, Tensor]:
    """Per-row ratio bounds (lo, hi), shape like ``advantages``, for ``clipped_surrogate``.

    A > 0: (−inf, 1+ε_high)  — DAPO clip-higher (Yu et al. 2025); (−inf, +inf) for UP's branch.
    A ≤ 0: (1−ε_low, c)      — c = dual_clip (Ye et al. 2020 dual-clip PPO, as in verl's
                              ``compute_policy_loss``), +inf when off.
    """
    pos = advantages > 0
    hi_pos = math.inf if unbounded_positive else 1.0 + eps_high
    hi_neg = math.inf if dual_clip is None else float(dual_clip)
    lo = advantages.new_tensor(-math.inf).where(pos, advantages.new_tensor(1.0 - eps_low))
    hi = advantages.new_tensor(hi_pos).where(pos, advantages.new_tensor(hi_neg))
    return lo, hi


def clipped_surrogate(ratio: Tensor, advantages: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """PPO clipped surrogate (Schulman et al. 2017, Eq. 7) as a loss, with verl's dual clip:
    ℓ = −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A), capped at −A·c for A < 0
      = −A·clamp(r, lo, hi) with (lo, hi) from ``clip_bounds``.

    ``advantages`` and the bounds broadcast against ``ratio`` ((B, 1) against (B, T) or (B, 1)).
    """
    return -advantages * ratio.clamp(min=lo, max=hi)


def clipped(b: Batch, ratio: Tensor, *, unbounded_positive: bool = False, plain_log_ratio: Tensor | None = None,
            plain_ratio: Tensor | None = None) -> Surrogate:
    """The clipped surrogate of ``ratio`` under the batch's bounds, as a ``Surrogate``; pass the
    plain log-ratio (and its exp) when already computed, so the metrics do not compute them again."""
    lo, hi = clip_bounds(b.adv, eps_low=b.eps_low, eps_high=b.eps_high, dual_clip=b.dual_clip,
                         unbounded_positive=unbounded_positive)
    return Surrogate(clipped_surrogate(ratio, b.adv, lo, hi), ratio, lo, hi, plain_log_ratio, plain_ratio)


def token_clipped(b: Batch) -> Surrogate:
    """The PPO clipped surrogate on the token ratio r_t (GRPO, DAPO and Dr. GRPO differ only in their
    ε defaults and aggregation)."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    ratio = log_r.exp()
    return clipped(b, ratio, plain_log_ratio=log_r, plain_ratio=ratio)


# =========================================================================== the objectives
GSPO_EPS = {"epsilon": 3e-4, "epsilon_high": 4e-4}  # GSPO's clip range (Zheng et al. 2025)


@register_objective("grpo", aggregation="seq-mean-token-mean", capacity="clipped")
def grpo(b: Batch) -> Surrogate:
    """GRPO (Shao et al. 2024, Eq. 3): −min(r_t·A, clip(r_t, 1−ε, 1+ε)·A) per token; seq-mean-token-mean."""
    return token_clipped(b)


# DAPO (Yu et al. 2025): clip-higher 0.2/0.28 (DEFAULT_EPS), token-level loss, no KL (β = 0,
# armorlab's default) and dynamic sampling; its overlong reward shaping is a reward function, not
# an objective setting
@register_objective("dapo", aggregation="token-mean", capacity="clipped",
                    defaults={"dynamic_sampling": True})
def dapo(b: Batch) -> Surrogate:
    """DAPO (Yu et al. 2025): the same surrogate with decoupled ε_low/ε_high; token-mean."""
    return token_clipped(b)


@register_objective("dr_grpo", aggregation="seq-mean-token-sum-norm", capacity="clipped")
def dr_grpo(b: Batch) -> Surrogate:
    """Dr. GRPO (Liu et al. 2025, Eq. 3): the same surrogate; sum per sequence / L_max."""
    return token_clipped(b)


@register_objective("gspo", aggregation="seq-mean", capacity="clipped", sequence_level=True, defaults=GSPO_EPS)
def gspo(b: Batch) -> Surrogate:
    """GSPO (Zheng et al. 2025, §4.1): −min(s_i·A_i, clip(s_i)·A_i), one loss per sequence."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    return clipped(b, sequence_log_ratio(log_r, b.n_tokens).exp(), plain_log_ratio=log_r)


@register_objective("up", aggregation="token-mean", capacity="unbounded_positive")
def up(b: Batch) -> Surrogate:
    """UP (arXiv 2607.06987): A > 0 → −A·π_θ/sg(π_θ) unclipped; A ≤ 0 → the dapo surrogate."""
    log_r = token_log_ratio(b.logp, up_denominator(b.logp, b.old_logp, b.adv))
    return clipped(b, log_r.exp(), unbounded_positive=True)


@register_objective("up_gspo", aggregation="seq-mean", capacity="unbounded_positive", sequence_level=True,
                    defaults=GSPO_EPS)
def up_gspo(b: Batch) -> Surrogate:
    """UP on GSPO (arXiv 2607.06987): A > 0 → −A·exp(mean_t(log π_θ − sg(log π_θ))) unclipped;
    A ≤ 0 → gspo."""
    log_r = token_log_ratio(b.logp, up_denominator(b.logp, b.old_logp, b.adv))
    return clipped(b, sequence_log_ratio(log_r, b.n_tokens).exp(), unbounded_positive=True)


# UP's ablations (arXiv 2607.06987, §5.3 and Fig. 5): what UP's positive branch is compared with
@register_objective("up_pure_is", aggregation="token-mean", capacity="unbounded_positive")
def up_pure_is(b: Batch) -> Surrogate:
    """UP's "pure IS" ablation: A > 0 → −A·π_θ/π_old, the importance ratio unclipped; A ≤ 0 → dapo."""
    log_r = token_log_ratio(b.logp, b.old_logp)
    ratio = log_r.exp()
    return clipped(b, ratio, unbounded_positive=True, plain_log_ratio=log_r, plain_ratio=ratio)


@register_objective("up_self_anchored", aggregation="token-mean", capacity="unbounded")
def up_self_anchored(b: Batch) -> Surrogate:
    """UP's self-anchored ablation: −A·π_θ/sg(π_θ) on both advantage signs (value 1, gradient
    −A·∇log π_θ), no bound on either side: π_old enters nowhere."""
    ratio = token_log_ratio(b.logp, b.logp.detach()).exp()
    unbounded = b.adv.new_tensor(math.inf).expand_as(b.adv)
    return Surrogate(-b.adv * ratio, ratio, -unbounded, unbounded)


# ARMOR's τ = 160 rollout steps is the paper's; the shipped tiny sweeps set a scaled-down τ themselves
@register_objective("armor", aggregation="token-mean", capacity="mixed", uses_reference=True,
                    defaults={"anchor": True, "anchor_gate": True, "ref_reset_steps": 160})
def armor(b: Batch) -> Surrogate:
    """ARMOR (arXiv 2607.10481): PPO Eq. 7 with DAPO's clip on r_mix (``mixed_ratio``)."""
    assert b.ref_logp is not None  # validated in policy_loss
    log_r = token_log_ratio(b.logp, b.old_logp)
    ratio = log_r.exp()
    r_mix = mixed_ratio(b.logp, b.old_logp, b.ref_logp, b.alpha, plain_ratio=ratio)
    return clipped(b, r_mix, plain_log_ratio=log_r, plain_ratio=ratio)
