"""Invariants of armorlab.algos.objectives (issue 2 §4: 1–6 and 9; 7 in test_objectives_values.py,
8 in test_objectives_props.py). Reference values come from independent float64 numpy formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from armorlab.algos.field_objectives import MICRO_BATCH_SELECTION
from armorlab.algos.loss import AGGREGATORS, policy_loss
from armorlab.algos.objectives import mixed_ratio, objective_names, objective_spec
from armorlab.errors import ArmorLabError

ALL = list(objective_names())
# the objectives built as −A·clamp(ratio, lo, hi): zero gradient exactly where a bound binds
CLAMPED = [o for o in ALL if objective_spec(o).fn.__module__ == "armorlab.algos.objectives"
           and objective_spec(o).capacity != "unbounded"] + ["bnpo", "luspo"]  # up_self_anchored has no bound
SEQUENCE_RATIO = ("gspo", "up_gspo", "luspo")
# whole-batch objectives: they select tokens by the statistics of the batch they are given
PER_BATCH = [o for o in ALL if o not in MICRO_BATCH_SELECTION]
DEFAULT_AGGREGATION = {name: objective_spec(name).aggregation for name in ALL}
AGGS = list(AGGREGATORS)


def batch(b=6, t=9, seed=0, spread=0.4, lengths=None):
    """Random (logp, old, ref, adv, mask); rows have different lengths, A has both signs and a 0."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3 - 0.05
    logp = old + spread * torch.randn(b, t, generator=g)
    ref = old + 0.5 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    adv[0] = 0.0
    adv[1] = abs(adv[1]) + 0.1
    adv[2] = -abs(adv[2]) - 0.1
    if lengths is None:
        lengths = torch.randint(1, t + 1, (b,), generator=g)
        lengths[-1] = t
    mask = (torch.arange(t)[None] < torch.as_tensor(lengths)[:, None]).to(torch.float32)
    return logp, old, ref, adv, mask


def run(objective, logp, old, adv, mask, **kw):
    logp = logp.clone().requires_grad_(True)
    kw.setdefault("max_len", logp.shape[1] + 3)
    kw.setdefault("params", {"dro_beta": 0.1} if objective == "dro" else None)  # verl's DRO has no default β
    out = policy_loss(objective, logp, old, adv, mask, **kw)
    out.loss.backward()
    return out, logp.grad


def np_aggregate(per_token, mask, aggregation, max_len):
    """Independent numpy version of the five aggregations (float64); rows without tokens never count."""
    per_token = per_token * mask
    n_row = mask.sum(-1)
    rows = n_row > 0
    if aggregation == "token-mean":
        return per_token.sum() / max(mask.sum(), 1.0)
    if aggregation in ("seq-mean-token-mean", "seq-mean"):
        return (per_token.sum(-1)[rows] / n_row[rows]).mean()
    if aggregation == "seq-mean-token-sum":
        return per_token.sum(-1)[rows].mean()
    return per_token.sum(-1)[rows].mean() / max_len


def reinforce_grad(weight, adv, mask, aggregation, max_len, sequence=False):
    """∂/∂logp of aggregate(−A·w·logp): the REINFORCE gradient (w = 1) under an aggregation.

    For sequence objectives the per-token loss is the sequence's −A·mean_t(w·logp) on every
    token, so each token's share is spread over the row's length first.
    """
    b, t = mask.shape
    grad = np.zeros((b, t))
    n_row = np.maximum(mask.sum(-1), 1.0)
    for i in range(b):
        for j in range(t):
            if not mask[i, j]:
                continue
            d = -adv[i] * weight[i, j]
            if sequence:  # ℓ_i = −A·mean_t(logp) appears on n_i tokens
                d = d / n_row[i]
                e = np.zeros((b, t))
                e[i] = mask[i] * d
            else:
                e = np.zeros((b, t))
                e[i, j] = d
            grad[i, j] = np_aggregate(e, mask, aggregation, max_len)
    return grad


# --------------------------------------------------------------------------- invariant 1
@pytest.mark.parametrize("objective", [o for o in PER_BATCH if o != "armor"])
@pytest.mark.parametrize("aggregation", AGGS)
def test_on_policy_gradient_is_reinforce(objective, aggregation):
    logp, _, ref, adv, mask = batch()
    eps_high = 5.0 if objective == "cispo" else 0.28  # CISPO's ε_max caps the weight itself (its preset: 5)
    _, grad = run(objective, logp, logp.detach(), adv, mask, ref_logp=ref, aggregation=aggregation, eps_high=eps_high)
    want = reinforce_grad(np.ones(mask.shape), adv.numpy().astype(np.float64), mask.numpy(), aggregation,
                          logp.shape[1] + 3, sequence=objective_spec(objective).sequence_level)
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("aggregation", AGGS)
@pytest.mark.parametrize("alpha", [0.3, 0.8, 1.0])
def test_armor_on_policy_gradient_is_weighted_reinforce(aggregation, alpha):
    logp, _, ref, adv, mask = batch(seed=1)
    _, grad = run("armor", logp, logp.detach(), adv, mask, ref_logp=ref, alpha=alpha, aggregation=aggregation)
    p_old, p_ref = np.exp(logp.double().numpy()), np.exp(ref.double().numpy())
    w = alpha * p_old / (alpha * p_old + (1 - alpha) * p_ref)
    want = reinforce_grad(w, adv.double().numpy(), mask.numpy(), aggregation, logp.shape[1] + 3)
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("alpha", [0.25, 0.6])
def test_armor_with_ref_equal_old_is_alpha_times_reinforce(alpha):
    # ARMOR §4.2: Δmix = α·Δθ when π_ref = π_old.
    logp, _, _, adv, mask = batch(seed=2)
    _, grad = run("armor", logp, logp.detach(), adv, mask, ref_logp=logp.detach(), alpha=alpha)
    _, base = run("dapo", logp, logp.detach(), adv, mask)
    torch.testing.assert_close(grad, alpha * base, rtol=1e-5, atol=1e-8)


# --------------------------------------------------------------------------- invariant 2
def _np_binding(ratio, adv, eps_low, eps_high, dual_clip, unbounded_positive=False):
    a = adv[:, None]
    pos = (a > 0) & (ratio > 1 + eps_high) & (not unbounded_positive)
    neg = (a < 0) & ((ratio < 1 - eps_low) | ((ratio > dual_clip) if dual_clip else False))
    return pos | neg


@pytest.mark.parametrize("objective", CLAMPED)
@pytest.mark.parametrize("dual_clip", [None, 1.6])
def test_gradient_zero_exactly_where_a_clip_binds(objective, dual_clip):
    logp, old, ref, adv, mask = batch(b=16, t=12, seed=3, spread=0.5)
    eps = (0.2, 0.28) if objective not in SEQUENCE_RATIO else (0.02, 0.03)
    _, grad = run(objective, logp, old, adv, mask, ref_logp=ref, alpha=0.7, dual_clip=dual_clip,
                  eps_low=eps[0], eps_high=eps[1])
    lp, lo, lr, m = (x.double().numpy() for x in (logp, old, ref, mask))
    a = adv.double().numpy()
    if objective in SEQUENCE_RATIO:
        s = np.exp(((lp - lo) * m).sum(-1) / m.sum(-1))
        ratio = np.repeat(s[:, None], m.shape[1], axis=1)
    elif objective == "armor":
        ratio = (0.7 * np.exp(lp) + 0.3 * np.exp(lr)) / (0.7 * np.exp(lo) + 0.3 * np.exp(lr))
    else:
        ratio = np.exp(lp - lo)
    binds = _np_binding(ratio, a, *eps, dual_clip, unbounded_positive=objective in ("up", "up_gspo", "up_pure_is"))
    live = (m > 0) & (a[:, None] != 0)
    g = grad.numpy()
    assert binds[live].any() and (~binds[live]).any(), "batch must exercise both cases"
    assert (g[live & binds] == 0).all()
    assert (g[live & ~binds] != 0).all()
    assert (g[m == 0] == 0).all()


# --------------------------------------------------------------------------- invariant 3
def test_up_positive_branch_is_minus_advantage_whatever_old_logp():
    logp, old, _, adv, mask = batch(seed=4, spread=2.0)  # far off-policy: dapo would clip a lot
    out, grad = run("up", logp, old, adv, mask)
    pos = adv > 0
    m = mask.bool()
    expected = (-adv[:, None]).expand_as(mask)
    assert torch.equal(out.per_token[pos][m[pos]], expected[pos][m[pos]])
    # gradient −A·∇logp / N on every unmasked A > 0 token (token-mean), unclipped
    n = mask.sum()
    torch.testing.assert_close(grad[pos], (-adv[pos, None] / n) * mask[pos])
    out2, _ = run("up", logp, old + 5.0, adv, mask)  # old_logp moved: positive rows unchanged
    assert torch.equal(out2.per_token[pos], out.per_token[pos])


def test_up_non_positive_rows_equal_dapo():
    logp, old, _, adv, mask = batch(seed=5, spread=0.6)
    for dual_clip in (None, 1.5):
        up, g_up = run("up", logp, old, adv, mask, dual_clip=dual_clip)
        dapo, g_dapo = run("dapo", logp, old, adv, mask, dual_clip=dual_clip)
        rows = adv <= 0
        assert torch.equal(up.per_token[rows], dapo.per_token[rows])
        assert torch.equal(g_up[rows], g_dapo[rows])
    adv_neg = -adv.abs()
    up, g_up = run("up", logp, old, adv_neg, mask)
    dapo, g_dapo = run("dapo", logp, old, adv_neg, mask)
    assert torch.equal(up.loss, dapo.loss) and torch.equal(g_up, g_dapo)


# --------------------------------------------------------------------------- invariant 4
@pytest.mark.parametrize("aggregation", AGGS)
def test_armor_alpha_one_is_dapo_bit_for_bit(aggregation):
    logp, old, ref, adv, mask = batch(seed=6, spread=0.6)
    armor, g_armor = run("armor", logp, old, adv, mask, ref_logp=ref, alpha=1.0, aggregation=aggregation,
                         dual_clip=2.0)
    dapo, g_dapo = run("dapo", logp, old, adv, mask, aggregation=aggregation, dual_clip=2.0)
    assert torch.equal(armor.loss, dapo.loss)
    assert torch.equal(armor.per_token, dapo.per_token)
    assert torch.equal(g_armor, g_dapo)


def test_armor_ref_equal_old_mixes_linearly():
    logp, old, _, adv, mask = batch(seed=7, spread=0.6)
    alpha = 0.35
    r = torch.exp(logp - old)
    for plain in (None, r):  # log-space and linear evaluation
        got = mixed_ratio(logp, old, old, alpha, plain_ratio=plain)
        torch.testing.assert_close(got, alpha * r + (1 - alpha), rtol=1e-6, atol=1e-6)
    # and through the loss: with a clip range too wide to bind, per-token = −A·(α·r + 1 − α)
    out, _ = run("armor", logp, old, adv, mask, ref_logp=old, alpha=alpha, eps_low=1.0, eps_high=100.0)
    torch.testing.assert_close(out.per_token, -adv[:, None] * (alpha * r + 1 - alpha) * mask,
                               rtol=1e-6, atol=1e-6)


def test_armor_finite_for_extreme_log_probs():
    # π underflows to 0 in float32 at −1e4; the mixed ratio must stay finite and exact.
    logp = torch.tensor([[-1.0, -1e4, -1e4, -1.0]], requires_grad=True)
    old = torch.tensor([[-1e4, -1.0, -1e4, -1.0]])
    ref = torch.tensor([[-1.0, -1.0, 0.0, -1e4]])
    out = policy_loss("armor", logp, old, torch.tensor([-1.0]), torch.ones(1, 4), ref_logp=ref, alpha=0.8,
                      eps_low=10.0, eps_high=10.0)
    out.loss.backward()
    # r_mix = (0.8π + 0.2π_ref)/(0.8π_old + 0.2π_ref):
    #   t0: (0.8e⁻¹ + 0.2e⁻¹)/(0.2e⁻¹) = 5; t1: (0.2e⁻¹)/(0.8e⁻¹ + 0.2e⁻¹) = 0.2;
    #   t2: (0 + 0.2)/(0 + 0.2) = 1; t3: e⁻¹/e⁻¹ = 1 (π_ref = 0 → plain ratio).
    torch.testing.assert_close(out.per_token, torch.tensor([[5.0, 0.2, 1.0, 1.0]]))
    assert torch.isfinite(logp.grad).all()
    # ∂r_mix/∂logπ = 0.8π/D: t0 0.8e⁻¹/0.2e⁻¹ = 4, t1 0, t2 0, t3 1; times −A/N = 1/4
    torch.testing.assert_close(logp.grad, torch.tensor([[1.0, 0.0, 0.0, 0.25]]))


@pytest.mark.parametrize("alpha", [0.05, 0.5, 0.95, 1.0])
def test_mixed_ratio_linear_and_log_space_agree(alpha):
    # Against an independent float64 evaluation of (απ + (1−α)π_ref)/(απ_old + (1−α)π_ref),
    # both evaluations, values and gradients, including π_ref ≫ π_old (anchor-like tokens).
    logp, old, ref, _, _ = batch(b=5, t=7, seed=15, spread=1.5)
    ref = ref.clone()
    ref[0] = old[0] + 30.0
    p, po, pr = (np.exp(x.double().numpy()) for x in (logp, old, ref))
    want = (alpha * p + (1 - alpha) * pr) / (alpha * po + (1 - alpha) * pr)
    want_grad = alpha * p / (alpha * po + (1 - alpha) * pr)  # ∂r_mix/∂log π
    for linear in (False, True):
        x = logp.clone().requires_grad_(True)
        plain = torch.exp(x - old) if linear else None
        got = mixed_ratio(x, old, ref, alpha, plain_ratio=plain)
        got.sum().backward()
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=2e-6, atol=2e-7)
        np.testing.assert_allclose(x.grad.numpy(), want_grad, rtol=2e-6, atol=1e-12)


def test_mixed_ratio_falls_back_to_log_space_for_huge_ratios():
    # r = e^100 overflows float32; the linear form would give inf, log space gives the true 5.
    logp, old, ref = torch.tensor([[-1.0]]), torch.tensor([[-101.0]]), torch.tensor([[-1.0]])
    got = mixed_ratio(logp, old, ref, 0.8, plain_ratio=torch.exp(logp - old))
    torch.testing.assert_close(got, torch.tensor([[5.0]]))


def test_armor_per_row_alpha_tensor():
    # anchor rows can get α = 1 (plain ratio) while others mix: rows must match the scalar runs.
    logp, old, ref, adv, mask = batch(seed=8, spread=0.5)
    alpha = torch.full((logp.shape[0], 1), 0.6)
    alpha[::2] = 1.0
    mixed, g = run("armor", logp, old, adv, mask, ref_logp=ref, alpha=alpha)
    one, g1 = run("armor", logp, old, adv, mask, ref_logp=ref, alpha=1.0)
    six, g6 = run("armor", logp, old, adv, mask, ref_logp=ref, alpha=0.6)
    torch.testing.assert_close(mixed.per_token[::2], one.per_token[::2], rtol=0, atol=0)
    torch.testing.assert_close(mixed.per_token[1::2], six.per_token[1::2], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g[1::2], g6[1::2], rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(g[::2], g1[::2], rtol=0, atol=0)


# --------------------------------------------------------------------------- invariant 5
@pytest.mark.parametrize("objective", [o for o in PER_BATCH if DEFAULT_AGGREGATION[o] == "token-mean"])
def test_micro_batch_token_mean_invariance(objective):
    logp, old, ref, adv, mask = batch(b=8, t=10, seed=9, spread=0.5)
    kw = {"ref_logp": ref, "alpha": 0.7, "dual_clip": 2.5}
    full, g_full = run(objective, logp, old, adv, mask, **kw)
    parts, grads, counts = [], [], []
    for sl in (slice(0, 3), slice(3, 8)):
        kw_part = {**kw, "ref_logp": ref[sl]}
        out, g = run(objective, logp[sl], old[sl], adv[sl], mask[sl], **kw_part)
        parts.append(out.loss)
        grads.append(g)
        counts.append(mask[sl].sum())
    total = counts[0] + counts[1]
    combined = (parts[0] * counts[0] + parts[1] * counts[1]) / total
    torch.testing.assert_close(combined, full.loss, rtol=1e-6, atol=1e-7)
    stitched = torch.cat([grads[0] * counts[0] / total, grads[1] * counts[1] / total])
    torch.testing.assert_close(stitched, g_full, rtol=1e-5, atol=1e-9)


# --------------------------------------------------------------------------- normalizer (issue 9 §1)
@pytest.mark.parametrize("objective", PER_BATCH)
@pytest.mark.parametrize("aggregation", AGGS)
def test_parts_with_the_whole_normalizer_add_up_to_the_whole(objective, aggregation):
    """Split a batch into parts of different lengths (one of them with a gated row): with the
    whole batch's count as ``normalizer`` the parts' losses and gradients add up to the whole's."""
    logp, old, ref, adv, mask = batch(b=8, t=10, seed=21, spread=0.5, lengths=[2, 10, 3, 7, 1, 9, 5, 10])
    mask[5] = 0.0  # a gated row: in no count
    kw = {"ref_logp": ref, "alpha": 0.7, "dual_clip": 2.5, "aggregation": aggregation, "max_len": 12,
          "params": {"dro_beta": 0.1} if objective == "dro" else None}
    whole, g_whole = run(objective, logp, old, adv, mask, **kw)
    per_row = mask.sum(-1)
    count = per_row.sum() if aggregation == "token-mean" else (per_row > 0).sum().float()
    assert float(count) == (47.0 - 9.0 if aggregation == "token-mean" else 7.0)  # by hand
    losses, grads = [], []
    for sl in (slice(0, 3), slice(3, 8)):
        out, g = run(objective, logp[sl], old[sl], adv[sl], mask[sl], normalizer=count,
                     **{**kw, "ref_logp": ref[sl]})
        own = policy_loss(objective, logp[sl], old[sl], adv[sl], mask[sl], **{**kw, "ref_logp": ref[sl]}).loss
        own_count = mask[sl].sum() if aggregation == "token-mean" else (mask[sl].sum(-1) > 0).sum()
        # L·ν is the part's sum: the same sum its own mean times its own count gives
        torch.testing.assert_close(out.loss * count, own * own_count, rtol=1e-6, atol=1e-6)
        losses.append(out.loss)
        grads.append(g)
    torch.testing.assert_close(losses[0] + losses[1], whole.loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(torch.cat(grads), g_whole, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("aggregation", [a for a in AGGS if a != "token-mean"])
def test_a_row_without_tokens_does_not_dilute_a_seq_mean(aggregation):
    """By hand: on policy (ratio 1) each token's loss is −A; rows of 2 and 4 tokens with A = 1 and
    −0.25, plus one all-masked row that must not count as a third sequence."""
    logp = torch.zeros(3, 4)
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    adv = torch.tensor([1.0, -0.25, 3.0])
    want = {"seq-mean-token-mean": (-1.0 + 0.25) / 2, "seq-mean": (-1.0 + 0.25) / 2,
            "seq-mean-token-sum": (-2.0 + 1.0) / 2, "seq-mean-token-sum-norm": (-2.0 + 1.0) / 2 / 8}[aggregation]
    out = policy_loss("grpo", logp, logp, adv, mask, aggregation=aggregation, max_len=8)
    assert float(out.loss) == pytest.approx(want, abs=1e-7)
    two = policy_loss("grpo", logp[:2], logp[:2], adv[:2], mask[:2], aggregation=aggregation, max_len=8)
    assert torch.equal(out.loss, two.loss)


@pytest.mark.parametrize("bad", [0, -1.0, True, "3", float("nan")])
def test_bad_normalizer_is_named(bad):
    logp, old, _, adv, mask = batch()
    with pytest.raises(ArmorLabError, match="normalizer"):
        policy_loss("dapo", logp, old, adv, mask, normalizer=bad)


# --------------------------------------------------------------------------- invariant 6
@pytest.mark.parametrize("objective", ALL)
@pytest.mark.parametrize("poison", [math.nan, math.inf, -math.inf])
def test_garbage_at_masked_positions_changes_nothing(objective, poison):
    logp, old, ref, adv, mask = batch(seed=10, spread=0.5)
    kw = {"ref_logp": ref, "alpha": 0.7, "dual_clip": 3.0}
    clean, g_clean = run(objective, logp, old, adv, mask, **kw)
    hole = mask == 0
    assert hole.any()
    dirty = [x.masked_fill(hole, poison) for x in (logp, old, ref)]
    out, g = run(objective, dirty[0], dirty[1], adv, mask, **{**kw, "ref_logp": dirty[2]})
    assert torch.equal(out.loss, clean.loss)
    assert torch.equal(out.per_token, clean.per_token)
    assert torch.equal(g, g_clean)
    assert out.metrics == clean.metrics


def test_empty_row_with_nan_advantage_is_harmless():
    logp, old, _, adv, mask = batch(seed=11)
    mask[0] = 0
    adv = adv.clone()
    adv[0] = math.nan
    out, g = run("grpo", logp, old, adv, mask)
    assert torch.isfinite(out.loss) and torch.isfinite(g).all()
    assert all(math.isfinite(v) for v in out.metrics.values())


def test_metrics_are_floats_and_loss_keeps_graph():
    logp, old, ref, adv, mask = batch(seed=12)
    for objective in ALL:
        out, _ = run(objective, logp, old, adv, mask, ref_logp=ref, alpha=0.5)
        assert out.loss.dim() == 0 and out.per_token.shape == logp.shape
        assert all(type(v) is float for v in out.metrics.values())
        expected = {"clip_frac_low", "clip_frac_high", "clip_frac", "dual_clip_frac", "ratio_mean", "approx_kl",
                    "widened_frac", "narrowed_frac", "plain_clip_frac", "freed_frac"}
        if objective == "armor":
            expected |= {"mix_ratio_mean"}
        assert set(out.metrics) == expected


def test_approx_kl_is_mean_old_minus_logp():
    logp, old, _, adv, mask = batch(seed=13)
    out, _ = run("dapo", logp, old, adv, mask)
    m = mask.double().numpy()
    want = ((old.double().numpy() - logp.double().numpy()) * m).sum() / m.sum()
    assert out.metrics["approx_kl"] == pytest.approx(want, rel=1e-5)


# --------------------------------------------------------------------------- invariant 9
def _args(**over):
    logp, old, ref, adv, mask = batch(b=3, t=4, seed=14)
    kw = {"objective": "dapo", "logp": logp, "old_logp": old, "advantages": adv, "mask": mask,
          "ref_logp": ref}
    kw.update(over)
    return kw


@pytest.mark.parametrize("over, key, value", [
    ({"objective": "ppo"}, "objective", "'ppo'"),
    ({"objective": "armor", "alpha": 0.0}, "alpha", "0.0"),
    ({"objective": "armor", "alpha": 1.5}, "alpha", "1.5"),
    ({"objective": "armor", "alpha": -0.1}, "alpha", "-0.1"),
    ({"objective": "armor", "alpha": torch.tensor([[0.5], [1.2], [0.3]])}, "alpha", "1.2"),
    ({"objective": "armor", "alpha": torch.tensor([0.5, 0.5, 0.5])}, "alpha", "(3,)"),
    ({"eps_low": -0.1}, "eps_low", "-0.1"),
    ({"eps_high": -0.5}, "eps_high", "-0.5"),
    ({"dual_clip": 1.0}, "dual_clip", "1.0"),
    ({"dual_clip": 0.5}, "dual_clip", "0.5"),
    ({"objective": "armor", "ref_logp": None}, "ref_logp", "None"),
    ({"old_logp": torch.zeros(3, 5)}, "old_logp", "(3, 5)"),
    ({"mask": torch.ones(2, 4)}, "mask", "(2, 4)"),
    ({"advantages": torch.zeros(3, 1)}, "advantages", "(3, 1)"),
    ({"objective": "armor", "ref_logp": torch.zeros(3, 3)}, "ref_logp", "(3, 3)"),
    ({"objective": "dr_grpo"}, "max_len", "None"),
    ({"aggregation": "seq-mean-token-sum-norm"}, "max_len", "None"),
    ({"aggregation": "mean"}, "aggregation", "'mean'"),
    ({"logp": torch.zeros(3, 4, dtype=torch.long)}, "logp", "torch.int64"),
    ({"logp": torch.zeros(12)}, "logp", "(12,)"),
])
def test_bad_input_names_argument_and_value(over, key, value):
    kw = _args(**over)
    objective = kw.pop("objective")
    with pytest.raises(ValueError) as err:
        policy_loss(objective, **kw)
    assert isinstance(err.value, ArmorLabError)
    assert err.value.key == key
    assert f"key '{key}'" in str(err.value) and value in str(err.value)


def test_alpha_none_is_fine_for_objectives_that_ignore_it():
    kw = _args(alpha=None)
    out = policy_loss(kw.pop("objective"), **kw)
    assert torch.isfinite(out.loss)


def test_names_match_the_config_layer():
    # config.py validates run configs without torch; both must list the same names.
    from armorlab.core import config

    assert config.objective_choices() == tuple(ALL) == (
        "grpo", "dapo", "dr_grpo", "gspo", "up", "up_gspo", "up_pure_is", "up_self_anchored", "armor", "cispo", "cispo_verl", "sapo", "gmpo", "dppo_tv",
        "dppo_kl", "clip_cov", "kl_cov", "gpg", "dro", "bnpo", "luspo", "vespo")
    assert tuple(AGGREGATORS) == config.AGGREGATIONS
    assert [o for o in ALL if objective_spec(o).sequence_level] == ["gspo", "up_gspo", "gmpo", "luspo"]


@pytest.mark.parametrize("objective", ["dapo", "gspo", "armor"])
def test_half_precision_inputs_are_computed_in_float32(objective):
    # 300 tokens in a row: bf16 itself could not even count them (integers are exact only to 256).
    logp, old, ref, adv, mask = batch(b=3, t=300, seed=16, spread=0.3, lengths=[300, 257, 100])
    low = [x.to(torch.bfloat16) for x in (logp, old, ref)]
    out, grad = run(objective, low[0], low[1], adv, mask, ref_logp=low[2], alpha=0.7)
    ref_out, ref_grad = run(objective, *(x.float() for x in low[:2]), adv, mask, ref_logp=low[2].float(),
                            alpha=0.7)
    assert out.loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    assert torch.equal(out.loss, ref_out.loss)
    torch.testing.assert_close(grad, ref_grad.to(torch.bfloat16))


@pytest.mark.parametrize("dual_clip", [None, 1.4])
def test_armor_clip_and_widened_fractions_match_numpy(dual_clip):
    logp, old, ref, adv, mask = batch(b=24, t=16, seed=17, spread=0.6)
    out, _ = run("armor", logp, old, adv, mask, ref_logp=ref, alpha=0.6, dual_clip=dual_clip)
    lp, lo, lr, m = (x.double().numpy() for x in (logp, old, ref, mask))
    a = adv.double().numpy()[:, None]
    r = np.exp(lp - lo)
    r_mix = (0.6 * np.exp(lp) + 0.4 * np.exp(lr)) / (0.6 * np.exp(lo) + 0.4 * np.exp(lr))
    live = m > 0
    c = dual_clip or np.inf

    def binds(x):
        return ((a > 0) & (x > 1.28)) | ((a < 0) & ((x < 0.8) | (x > c)))

    n = live.sum()
    mix, plain = binds(r_mix) & live, binds(r) & live
    assert (plain & ~mix).sum() > 0
    assert dual_clip is None or ((a < 0) & (r > c) & ~((a < 0) & (r_mix > c)) & live).sum() > 0
    assert out.metrics["widened_frac"] == pytest.approx((plain & ~mix).sum() / n)
    assert out.metrics["clip_frac"] == pytest.approx(mix.sum() / n)
    assert out.metrics["clip_frac_low"] == pytest.approx(((a < 0) & (r_mix < 0.8) & live).sum() / n)
    assert out.metrics["dual_clip_frac"] == pytest.approx(((a < 0) & (r_mix > c) & live).sum() / n)
    assert out.metrics["ratio_mean"] == pytest.approx((r * m).sum() / n, rel=1e-5)
    assert out.metrics["mix_ratio_mean"] == pytest.approx((r_mix * m).sum() / n, rel=1e-5)


@pytest.mark.parametrize("objective", ["dapo", "gspo", "armor"])
def test_token_means_are_undefined_when_every_token_is_masked(objective):
    logp, old, ref, adv, mask = batch(b=4, t=6, seed=3, spread=0.3)
    out, _ = run(objective, logp, old, adv, torch.zeros_like(mask), ref_logp=ref if objective == "armor" else None,
                 alpha=0.6)
    assert out.loss.item() == 0.0
    assert out.metrics and all(math.isnan(v) for v in out.metrics.values())
    assert "ratio_mean" in out.metrics and (objective != "armor" or "mix_ratio_mean" in out.metrics)
    partly, _ = run(objective, logp, old, adv, mask, ref_logp=ref if objective == "armor" else None, alpha=0.6)
    assert not any(math.isnan(v) for v in partly.metrics.values())
