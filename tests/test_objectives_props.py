"""Invariant 8: property tests over random shapes and values for invariants 1 (on-policy
gradient = REINFORCE, armor's = w-weighted), 4 (armor at α = 1 is dapo) and 6 (masked garbage
is inert). Example counts are kept small so the objectives suite stays well under a minute."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from armorlab.algos.field_objectives import MICRO_BATCH_SELECTION
from armorlab.algos.loss import AGGREGATORS, policy_loss
from armorlab.algos.objectives import objective_names, objective_spec

OBJECTIVES = objective_names()

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def batches(draw):
    b = draw(st.integers(1, 5))
    t = draw(st.integers(1, 7))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    old = -rng.uniform(0.01, 6.0, (b, t))
    logp = old + rng.normal(0, draw(st.sampled_from([0.0, 0.1, 0.5, 2.0])), (b, t))
    ref = -rng.uniform(0.01, 8.0, (b, t))
    lengths = rng.integers(0, t + 1, b)
    lengths[rng.integers(b)] = max(1, lengths.max())  # at least one token in the batch
    mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
    adv = rng.normal(0, 1.5, b)
    adv[rng.random(b) < 0.2] = 0.0
    as_t = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    return as_t(logp), as_t(old), as_t(ref), as_t(adv), as_t(mask)


def grad_of(objective, logp, old, adv, mask, **kw):
    logp = logp.clone().requires_grad_(True)
    kw.setdefault("params", {"dro_beta": 0.1} if objective == "dro" else None)  # verl's DRO has no default β
    with torch.random.fork_rng():  # clip_cov draws the tokens it clips from torch's RNG, as verl:
        torch.manual_seed(0)       # every call of a property draws the same ones
        out = policy_loss(objective, logp, old, adv, mask, max_len=logp.shape[1] + 2, **kw)
    out.loss.backward()
    return out, logp.grad


def np_aggregate(per_token, mask, aggregation, max_len):
    """The aggregations written out; rows without tokens are no sequences (they never count)."""
    per_token = per_token * mask
    if aggregation == "token-mean":
        return per_token.sum() / max(mask.sum(), 1.0)
    rows = [i for i in range(mask.shape[0]) if mask[i].sum() > 0]
    if aggregation in ("seq-mean-token-mean", "seq-mean"):
        return np.mean([per_token[i].sum() / mask[i].sum() for i in rows])
    if aggregation == "seq-mean-token-sum":
        return np.mean([per_token[i].sum() for i in rows])
    return np.mean([per_token[i].sum() for i in rows]) / max_len


def expected_grad(weight, adv, mask, aggregation, max_len, sequence):
    """∂/∂logp of aggregate(−A·w·logp) by linearity: aggregate a one-hot coefficient per token."""
    b, t = mask.shape
    n_row = np.maximum(mask.sum(-1), 1.0)
    out = np.zeros((b, t))
    for i, j in zip(*np.nonzero(mask), strict=True):
        e = np.zeros((b, t))
        if sequence:
            e[i] = -adv[i] * weight[i, j] / n_row[i]
        else:
            e[i, j] = -adv[i] * weight[i, j]
        out[i, j] = np_aggregate(e, mask, aggregation, max_len)
    return out


@SETTINGS
@given(data=batches(), objective=st.sampled_from([o for o in OBJECTIVES if o not in MICRO_BATCH_SELECTION]),
       aggregation=st.sampled_from(list(AGGREGATORS)), alpha=st.sampled_from([0.2, 0.7, 1.0]))
def test_on_policy_gradient_property(data, objective, aggregation, alpha):
    logp, _, ref, adv, mask = data
    _, grad = grad_of(objective, logp, logp.detach(), adv, mask, ref_logp=ref, alpha=alpha,
                      aggregation=aggregation, eps_high=5.0 if objective == "cispo" else 0.28)
    m = mask.double().numpy()
    if objective == "armor":
        p_old, p_ref = np.exp(logp.double().numpy()), np.exp(ref.double().numpy())
        weight = alpha * p_old / (alpha * p_old + (1 - alpha) * p_ref)
    else:
        weight = np.ones(m.shape)
    want = expected_grad(weight, adv.double().numpy(), m, aggregation, logp.shape[1] + 2,
                         sequence=objective_spec(objective).sequence_level)
    np.testing.assert_allclose(grad.numpy(), want, rtol=2e-5, atol=1e-7)


@SETTINGS
@given(data=batches(), aggregation=st.sampled_from(list(AGGREGATORS)),
       dual_clip=st.sampled_from([None, 1.5, 4.0]))
def test_armor_alpha_one_is_dapo_property(data, aggregation, dual_clip):
    logp, old, ref, adv, mask = data
    a, ga = grad_of("armor", logp, old, adv, mask, ref_logp=ref, alpha=1.0, aggregation=aggregation,
                    dual_clip=dual_clip)
    d, gd = grad_of("dapo", logp, old, adv, mask, aggregation=aggregation, dual_clip=dual_clip)
    assert torch.equal(a.loss, d.loss)
    assert torch.equal(a.per_token, d.per_token)
    assert torch.equal(ga, gd)


@SETTINGS
@given(data=batches(), objective=st.sampled_from(list(OBJECTIVES)),
       poison=st.sampled_from([math.nan, math.inf, -math.inf, 1e30, -1e30]),
       aggregation=st.sampled_from(list(AGGREGATORS)))
def test_masked_garbage_is_inert_property(data, objective, poison, aggregation):
    logp, old, ref, adv, mask = data
    kw = {"alpha": 0.6, "dual_clip": 2.0, "aggregation": aggregation}
    clean, g_clean = grad_of(objective, logp, old, adv, mask, ref_logp=ref, **kw)
    hole = mask == 0
    dirty = [x.masked_fill(hole, poison) for x in (logp, old, ref)]
    out, g = grad_of(objective, dirty[0], dirty[1], adv, mask, ref_logp=dirty[2], **kw)
    assert torch.equal(out.loss, clean.loss)
    assert torch.equal(g, g_clean)
    assert torch.equal(out.per_token, clean.per_token)
    assert out.metrics == clean.metrics
