"""Issue 39 §1: each of the field's objectives against an independent statement of the public
implementation it names — TRL 1.16 (``GRPOTrainer._compute_loss``) or verl 0.9.1
(``verl/trainer/ppo/core_algos.py``) — loss and gradient, on random masked batches, in one batch
(GA 1) and in two micro-batches (GA 2) under each reference's own normalisation rule.

The references below are written from the libraries' formulas as a reader of their source would
state them (TRL and verl receive advantages as (B, 1) and (B, T), and masked positions hold
arbitrary finite values); none calls armorlab. ``python tests/test_field_objectives.py`` prints
the parity table (objective, reference, max |error| of loss and gradient).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest
import torch

from armorlab.algos.loss import policy_loss

EPS_LOW, EPS_HIGH = 0.2, 0.28
PARAMS = {"clip_cov": {"clip_cov_ratio": 0.1}, "kl_cov": {"kl_cov_ratio": 0.1}, "dro": {"dro_beta": 0.3}}
EPS = {"cispo": (EPS_LOW, 5.0), "gmpo": (0.4, 0.4)}


def batch(seed: int, b: int = 8, t: int = 9):
    """(logp leaf, old, adv (B,), mask): lengths 1..t, no empty row, both advantage signs and a 0,
    ratios far enough from 1 that every clip and divergence bound binds somewhere; masked
    positions hold other finite values (the references must not read them)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3 - 0.02
    logp = (old + 0.9 * torch.randn(b, t, generator=g)).clamp(max=-1e-3)
    adv = 2 * torch.randn(b, generator=g)
    adv[0] = 0.0
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[-1] = t
    mask = (torch.arange(t)[None] < lengths[:, None]).float()
    return logp.requires_grad_(True), old, adv, mask


# =========================================================================== the references
def trl_per_token(kind: str, logp, old, adv, mask, eps_low, eps_high, params):
    """TRL 1.16 ``_compute_loss``: per-token loss of ``loss_type=kind`` (advantages (B, 1))."""
    a = adv.unsqueeze(1)
    log_ratio = logp - old
    if kind == "luspo":  # importance_sampling_level="sequence"
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    if kind == "cispo":
        return -torch.clamp(coef_1, max=eps_high).detach() * a * logp
    if kind in ("bnpo", "luspo"):
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        return -torch.min(coef_1 * a, coef_2 * a)
    if kind == "sapo":
        temps = torch.where(a > 0, params.get("sapo_temperature_pos", 1.0), params.get("sapo_temperature_neg", 1.05))
        return -(torch.sigmoid(temps * (coef_1 - 1)) * 4 / temps) * a
    if kind == "vespo":  # get_gamma_weights without vLLM correction, under no_grad
        with torch.no_grad():
            seq = torch.sum(torch.clamp(logp - old, -20.0, 20.0) * mask, dim=-1, keepdim=True)
            log_w = torch.clamp(seq, math.log(1e-8), 20.0)
            nonneg = a >= 0
            k = torch.where(nonneg, 2.0, 3.0)
            lam = torch.where(nonneg, 3.0, 2.0).clamp(min=1e-4)
            phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        return -phi * a * logp
    raise KeyError(kind)


def trl_loss(kind: str, parts, eps_low, eps_high, params):
    """TRL's aggregation of each micro-batch (loss_type rules), summed over the accumulation
    window: cispo/vespo divide by the generation batch's tokens (num_items_in_batch · GA/spg,
    spg = GA); sapo (as grpo) and luspo by GA; bnpo by the micro-batch's tokens and GA."""
    ga = len(parts)
    n_items = sum(m.sum() for *_, m in parts)
    total = 0.0
    for logp, old, adv, mask in parts:
        per = trl_per_token(kind, logp, old, adv, mask, eps_low, eps_high, params)
        if kind in ("cispo", "vespo"):
            total = total + (per * mask).sum() / n_items
        elif kind == "sapo":
            total = total + ((per * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / ga
        elif kind == "bnpo":
            total = total + (per * mask).sum() / mask.sum().clamp(min=1.0) / ga
        elif kind == "luspo":
            total = total + (per * mask).sum(-1).mean() / ga
    return total


def _verl_masked_mean(x, m):
    return (x * m).sum() / (m.sum() + 1e-8)


def verl_per_token(kind: str, logp, old, adv, mask, eps_low, eps_high, params):
    """verl 0.9.1 ``compute_policy_loss_<kind>`` before ``agg_loss`` (advantages (B, T)); gmpo
    returns its per-sequence loss (B,)."""
    a = adv.unsqueeze(1).expand_as(logp)
    neg_kl = logp - old
    if kind in ("cispo_verl", "sapo", "dppo_tv", "dppo_kl"):
        ratio = torch.exp(torch.clamp(neg_kl, min=-20.0, max=20.0))
    else:
        ratio = torch.exp(neg_kl)
    if kind == "cispo_verl":
        return -torch.clamp(ratio, 1 - eps_low, 1 + eps_high).detach() * a * logp
    if kind == "sapo":
        taus = torch.where(a > 0, torch.as_tensor(1.0), torch.as_tensor(1.05))
        return -(torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)) * a
    if kind in ("dppo_tv", "dppo_kl"):
        trunc = torch.clamp(ratio, max=3.0).detach()  # ActorConfig.clip_ratio_c
        prob, old_prob = torch.exp(logp), torch.exp(old)
        if kind == "dppo_tv":
            ok_pos, ok_neg = (prob - old_prob) <= eps_high, (prob - old_prob) >= -eps_low
        else:
            bkl = old_prob * (old - logp) + (1 - old_prob) * torch.log((1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
            ok_pos, ok_neg = (bkl <= eps_high) | (prob <= old_prob), (bkl <= eps_low) | (prob >= old_prob)
        valid = torch.where(a > 0, ok_pos, ok_neg).detach().float()
        return -a * trunc * logp * valid
    if kind == "gmpo":
        sgn = torch.sign(a)
        clamped = torch.clamp(neg_kl, -eps_low, eps_high)
        kept = sgn * torch.min(sgn * neg_kl, sgn * clamped)
        n = mask.sum(dim=-1)
        seq_ratio = torch.exp((kept * mask).sum(dim=-1) / (n + 1e-8))
        return -((a * mask).sum(dim=-1) / (n + 1e-8)) * seq_ratio
    if kind == "clip_cov":
        pg1 = -a * ratio
        pg2 = -a * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
        by_origin = (pg2 > pg1) & (mask > 0)
        cov = (a - _verl_masked_mean(a, mask)) * (logp - _verl_masked_mean(logp.detach(), mask))
        cov = cov.detach().clone()
        cov[mask == 0] = -torch.inf
        cov[by_origin] = -torch.inf
        n_clip = max(int(params["clip_cov_ratio"] * mask.sum().item()), 1)
        picks = torch.nonzero((cov < 5.0) & (cov > 1.0) & (mask > 0))
        corr = torch.ones_like(a)
        if len(picks) > 0:
            picks = picks[torch.randperm(len(picks))[: min(n_clip, len(picks))]]
            corr[picks[:, 0], picks[:, 1]] = 0
        return torch.maximum(pg1, pg2) * corr
    if kind == "kl_cov":
        pg = -a * ratio
        pg_kl = -a * ratio + params.get("ppo_kl_coef", 0.1) * neg_kl.abs()
        valid_idx = torch.nonzero((mask > 0).reshape(-1), as_tuple=True)[0]
        va, vl = a[mask > 0].detach().reshape(-1), logp[mask > 0].detach().reshape(-1)
        cov = (va - va.mean()) * (vl - vl.mean())
        top = valid_idx[torch.topk(cov, max(1, int(len(cov) * params["kl_cov_ratio"])), largest=True).indices]
        pg = pg.clone()
        t = a.shape[1]
        pg[top // t, top % t] = pg_kl[top // t, top % t]
        return pg
    if kind == "gpg":
        return -logp * a
    if kind == "dro":
        return -(logp * a - 0.5 * params["dro_beta"] * neg_kl.square())
    raise KeyError(kind)


def verl_loss(kind: str, parts, eps_low, eps_high, params):
    """verl's ``agg_loss`` with the global batch's counts (token-mean: tokens; seq-mean-token-mean:
    non-empty rows), summed over micro-batches; geo_mean takes each micro-batch's row mean / GA."""
    n_tokens = sum(m.sum() for *_, m in parts)
    n_rows = sum((m.sum(-1) > 0).sum() for *_, m in parts)
    total = 0.0
    for logp, old, adv, mask in parts:
        per = verl_per_token(kind, logp, old, adv, mask, eps_low, eps_high, params)
        if kind == "gmpo":
            total = total + torch.mean(per) / len(parts)
        elif kind == "sapo":
            seq = (per * mask).sum(-1) / (mask.sum(-1) + 1e-8)
            total = total + (seq * (mask.sum(-1) > 0).float()).sum() / n_rows
        else:
            total = total + (per * mask).sum() / n_tokens
    return total


# =========================================================================== armorlab at GA 1 and 2
def armorlab_loss(objective: str, parts, eps_low, eps_high, params):
    """armorlab's loss of the accumulation window: each micro-batch divided by the whole window's
    count (tokens or non-empty rows, its aggregation's unit), as the trainer does."""
    from armorlab.algos.loss import AGGREGATION_UNIT
    from armorlab.algos.objectives import objective_spec

    unit = AGGREGATION_UNIT[objective_spec(objective).aggregation]
    norm = sum(m.sum() if unit == "tokens" else (m.sum(-1) > 0).sum().float() for *_, m in parts)
    return sum(policy_loss(objective, lp, old, adv, m, eps_low=eps_low, eps_high=eps_high, params=params,
                           normalizer=norm).loss for lp, old, adv, m in parts)


# objective → (reference, its formula, whether its loss is a sum of micro-batch parts)
REFERENCES: dict[str, tuple[str, Callable, bool]] = {
    "cispo": ("TRL 1.16 loss_type=cispo", lambda *a: trl_loss("cispo", *a), True),
    "cispo_verl": ("verl 0.9.1 cispo", lambda *a: verl_loss("cispo_verl", *a), True),
    "sapo": ("TRL 1.16 loss_type=sapo", lambda *a: trl_loss("sapo", *a), True),
    "gmpo": ("verl 0.9.1 geo_mean", lambda *a: verl_loss("gmpo", *a), True),
    "dppo_tv": ("verl 0.9.1 dppo_tv", lambda *a: verl_loss("dppo_tv", *a), True),
    "dppo_kl": ("verl 0.9.1 dppo_kl", lambda *a: verl_loss("dppo_kl", *a), True),
    "clip_cov": ("verl 0.9.1 clip_cov", lambda *a: verl_loss("clip_cov", *a), False),
    "kl_cov": ("verl 0.9.1 kl_cov", lambda *a: verl_loss("kl_cov", *a), False),
    "gpg": ("verl 0.9.1 gpg", lambda *a: verl_loss("gpg", *a), True),
    "dro": ("verl 0.9.1 dro", lambda *a: verl_loss("dro", *a), True),
    "bnpo": ("TRL 1.16 loss_type=bnpo", lambda *a: trl_loss("bnpo", *a), False),
    "luspo": ("TRL 1.16 loss_type=luspo", lambda *a: trl_loss("luspo", *a), True),
    "vespo": ("TRL 1.16 loss_type=vespo", lambda *a: trl_loss("vespo", *a), True),
}
# the same objective against the other library's statement of it
SECOND = {"sapo": ("verl 0.9.1 sapo", lambda *a: verl_loss("sapo", *a))}


def _split(logp, old, adv, mask, ga):
    rows = logp.shape[0] // ga
    return [(logp[i * rows:(i + 1) * rows], old[i * rows:(i + 1) * rows], adv[i * rows:(i + 1) * rows],
             mask[i * rows:(i + 1) * rows]) for i in range(ga)]


def errors(objective: str, reference: Callable, ga: int, seed: int) -> tuple[float, float]:
    """max |loss − reference| and max |∇loss − ∇reference| on one random batch split in ``ga``."""
    eps_low, eps_high = EPS.get(objective, (EPS_LOW, EPS_HIGH))
    params = PARAMS.get(objective, {})
    logp, old, adv, mask = batch(seed)
    torch.manual_seed(seed)  # clip_cov draws its tokens from the global RNG, as verl does
    ours = armorlab_loss(objective, _split(logp, old, adv, mask, ga), eps_low, eps_high, params)
    (g_ours,) = torch.autograd.grad(ours, logp)
    torch.manual_seed(seed)
    ref = reference(_split(logp, old, adv, mask, ga), eps_low, eps_high, params)
    (g_ref,) = torch.autograd.grad(ref, logp)
    return float((ours - ref).detach().abs()), float((g_ours - g_ref).abs().max())


CASES = [(o, name, f, ga) for o, (name, f, additive) in REFERENCES.items() for ga in ((1, 2) if additive else (1,))]
CASES += [(o, name, f, ga) for o, (name, f) in SECOND.items() for ga in (1, 2)]
# float32 sums in another order (and verl's mean of a row-constant advantage for gmpo): a few ulps
TOLERANCE = 2e-6


@pytest.mark.parametrize("objective, reference, formula, ga", CASES, ids=[f"{c[1]}-GA{c[3]}" for c in CASES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_reference(objective, reference, formula, ga, seed):
    loss_err, grad_err = errors(objective, formula, ga, seed)
    assert loss_err <= TOLERANCE and grad_err <= TOLERANCE, (loss_err, grad_err)


def test_the_batches_exercise_every_bound():
    """Every bound the objectives have binds somewhere in the test batches, so a wrong bound fails."""
    logp, old, adv, mask = batch(0)
    r, m, a = torch.exp(logp - old).detach(), mask > 0, adv[:, None]
    diff = (logp.exp() - old.exp()).detach()
    assert ((r > 1 + EPS_HIGH) & (a > 0) & m).any() and ((r < 1 - EPS_LOW) & (a < 0) & m).any()
    assert ((r > 5.0) & m).any()                                  # CISPO's ε_max
    assert ((diff > EPS_HIGH) & (a > 0) & m).any() and ((diff < -EPS_LOW) & (a < 0) & m).any()  # DPPO
    assert ((r > 3.0) & m).any()                                  # DPPO's cap c
    assert ((logp - old).abs() > 0.4).logical_and(m).any()        # GMPO's log clip
    # Clip-Cov and KL-Cov select tokens here: their loss is not the plain surrogate's
    plain = policy_loss("dapo", logp, old, adv, mask).loss
    for objective in ("clip_cov", "kl_cov"):
        torch.manual_seed(0)
        assert abs(float(policy_loss(objective, logp, old, adv, mask, params=PARAMS[objective]).loss.detach() - plain.detach())) > 1e-4


@pytest.mark.parametrize("objective", ["gmpo", "cispo", "dppo_tv"])
def test_a_planted_error_fails(objective):
    """The comparison is sharp: the reference with its bound moved by 0.05 does not pass."""
    name, formula, _ = REFERENCES[objective]
    lo, hi = EPS.get(objective, (EPS_LOW, EPS_HIGH))

    def moved(parts, eps_low, eps_high, params):
        return formula(parts, eps_low, eps_high - 0.05, params)

    errs = [errors(objective, moved, 1, seed) for seed in (0, 1, 2)]
    assert max(max(e) for e in errs) > 1e-3, (name, errs)


def test_cispo_differs_between_trl_and_verl():
    """TRL clips r above ε_max only; verl clips to [1 − ε_low, 1 + ε_high]: different losses."""
    logp, old, adv, mask = batch(0)
    trl = policy_loss("cispo", logp, old, adv, mask, eps_high=5.0).loss
    verl = policy_loss("cispo_verl", logp, old, adv, mask).loss
    assert abs(float((trl - verl).detach())) > 1e-3


# --------------------------------------------------------------------------- capacity (UP Eq. 11) by family
def test_capacity_of_each_new_family_by_hand():
    """π_old = 0.5, ε = (0.2, 0.28) (GMPO: 0.4, 0.4): worked out with a calculator."""
    import numpy as np

    from armorlab.algos.capacity import token_capacity

    p, sign = np.array([0.5, 0.5]), np.array([1.0, -1.0])
    cap = {o: token_capacity(o, p, sign, **({"eps_low": 0.4, "eps_high": 0.4} if o == "gmpo" else {}))
           for o in ("cispo", "sapo", "gmpo", "dppo_tv", "clip_cov")}
    np.testing.assert_allclose(cap["cispo"], [0.5, 0.5])        # nothing stops the gradient
    np.testing.assert_allclose(cap["sapo"], [0.5, 0.5])
    np.testing.assert_allclose(cap["gmpo"], [0.2459123, 0.1648400], rtol=1e-6)  # 0.5·e^0.4 − 0.5, 0.5 − 0.5·e^−0.4
    np.testing.assert_allclose(cap["dppo_tv"], [0.28, 0.2])      # π_old ± δ
    np.testing.assert_allclose(cap["clip_cov"], [0.14, 0.1])     # PPO's 0.28·π_old, 0.2·π_old


def test_binary_kl_capacity_reaches_delta():
    """DPPO-KL's bounds are where the binary KL (computed here with logs) equals δ on each side."""
    import numpy as np

    from armorlab.algos.capacity import token_capacity

    p = np.array([0.02, 0.3, 0.6, 0.9])
    up = token_capacity("dppo_kl", p, np.ones(4)) + p
    down = p - token_capacity("dppo_kl", p, -np.ones(4))

    def kl(q):
        return p * np.log(p / q) + (1 - p) * np.log((1 - p + 1e-8) / (1 - q + 1e-8))

    np.testing.assert_allclose(kl(up), 0.28, rtol=1e-9)
    np.testing.assert_allclose(kl(down), 0.2, rtol=1e-9)
    assert (up > p).all() and (down < p).all()


@pytest.mark.parametrize("objective", ["cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl", "clip_cov", "vespo"])
def test_offline_capacity_of_sampled_tokens_is_token_capacity(objective):
    """`armorlab report`'s chunked kernel (numpy, from tokens/) gives capacity.token_capacity's
    statistics for the field's objectives too."""
    import numpy as np

    from armorlab.algos import capacity
    from armorlab.analysis.capacity_stats import token_kernel

    rng = np.random.default_rng(0)
    old = np.log(rng.uniform(0.01, 0.99, 500))
    adv = rng.normal(size=500)
    got = token_kernel(old + 0.1, old, None, adv, objective=objective, eps_low=0.2, eps_high=0.28, chunk=128)
    p, sign = np.exp(old), np.sign(adv)
    want = capacity.capacity_stats(capacity.token_capacity(objective, p, sign, eps_low=0.2, eps_high=0.28), p, sign,
                                   np.ones(500))
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6), key


def parity_table() -> list[tuple[str, str, int, float, float]]:
    rows = []
    for objective, name, formula, ga in CASES:
        errs = [errors(objective, formula, ga, seed) for seed in (0, 1, 2)]
        rows.append((objective, name, ga, max(e[0] for e in errs), max(e[1] for e in errs)))
    return rows


if __name__ == "__main__":
    print(f"{'objective':<11} {'reference':<27} GA  max|Δloss|  max|Δgrad|")
    for objective, name, ga, le, ge in parity_table():
        print(f"{objective:<11} {name:<27} {ga:>2}  {le:.2e}    {ge:.2e}")
