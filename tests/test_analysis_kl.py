"""KL estimators: exact values by hand, Monte Carlo unbiasedness of k1/k3 (both directions), k3 ≥ 0,
and k2's bias growing with the KL."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from armorlab.algos import kl


def test_exact_kl_hand_values():
    # 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln(4/3)
    assert kl.exact_kl([0.5, 0.5], [0.25, 0.75]) == pytest.approx(0.5 * math.log(4 / 3), rel=1e-12)
    assert kl.exact_kl([1.0, 0.0], [0.5, 0.5]) == pytest.approx(math.log(2), rel=1e-12)  # 0·log 0 = 0
    assert kl.exact_kl([0.5, 0.5], [1.0, 0.0]) == math.inf                              # q = 0 < p
    assert kl.exact_kl([0.2, 0.3, 0.5], [0.2, 0.3, 0.5]) == 0.0
    rows = kl.exact_kl(np.array([[0.5, 0.5], [1.0, 0.0]]), np.array([[0.25, 0.75], [0.5, 0.5]]))
    np.testing.assert_allclose(rows, [0.5 * math.log(4 / 3), math.log(2)], rtol=1e-12)


def test_exact_kl_from_logprobs_matches_probabilities():
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(7), size=3), rng.dirichlet(np.ones(7), size=3)
    np.testing.assert_allclose(kl.exact_kl_from_logprobs(np.log(p), np.log(q)), kl.exact_kl(p, q), rtol=1e-12)


def test_exact_kl_rejects_bad_input():
    with pytest.raises(ValueError, match="shape"):
        kl.exact_kl([0.5, 0.5], [1.0])
    with pytest.raises(ValueError, match="non-negative"):
        kl.exact_kl([1.5, -0.5], [0.5, 0.5])


def _pair(seed=0, k=6, spread=1.0):
    rng = np.random.default_rng(seed)
    theta = rng.dirichlet(np.ones(k) * 2.0)
    ref = rng.dirichlet(np.ones(k) * 2.0)
    # move ref toward theta to control the divergence
    ref = (1 - spread) * theta + spread * ref
    return theta, ref


def _mc_check(samples_per_token: np.ndarray, exact: float) -> None:
    se = samples_per_token.std(ddof=1) / math.sqrt(samples_per_token.size)
    assert abs(samples_per_token.mean() - exact) < 4 * se, (samples_per_token.mean(), exact, se)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_reverse_kl_is_unbiased_on_categorical(estimator):
    theta, ref = _pair(seed=3)
    rng = np.random.default_rng(10)
    x = rng.choice(theta.size, size=200_000, p=theta)           # samples of π_θ
    tokens = kl.reverse_kl_tokens(np.log(theta[x]), np.log(ref[x]), estimator)
    _mc_check(tokens, float(kl.exact_kl(theta, ref)))            # KL(π_θ‖π_ref)
    assert kl.reverse_kl(np.log(theta[x]), np.log(ref[x]), estimator_name=estimator) == pytest.approx(
        tokens.mean(), rel=1e-12)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_forward_kl_is_unbiased_on_categorical(estimator):
    theta, ref = _pair(seed=4)
    rng = np.random.default_rng(11)
    x = rng.choice(ref.size, size=200_000, p=ref)               # samples of π_ref (anchors)
    tokens = kl.forward_kl_tokens(np.log(theta[x]), np.log(ref[x]), estimator)
    _mc_check(tokens, float(kl.exact_kl(ref, theta)))            # KL(π_ref‖π_θ)


def test_next_token_forward_kl_by_importance_weighting_from_policy_samples():
    # one prefix (a single categorical): the next-token forward KL is KL(π_ref‖π_θ) there
    theta, ref = _pair(seed=5)
    rng = np.random.default_rng(12)
    x = rng.choice(theta.size, size=200_000, p=theta)
    tokens = kl.next_token_forward_kl_is_tokens(np.log(theta[x]), np.log(ref[x]))
    assert (tokens >= -1e-12).all()
    _mc_check(tokens, float(kl.exact_kl(ref, theta)))


def test_masked_mean_uses_only_masked_tokens():
    values = np.array([1.0, 100.0, 3.0])
    assert kl.masked_mean(values, np.array([True, False, True])) == 2.0
    assert math.isnan(kl.masked_mean(values, np.zeros(3, bool)))
    assert math.isnan(kl.masked_mean(np.empty(0)))


@given(st.floats(min_value=-50, max_value=50, allow_nan=False))
def test_k3_is_nonnegative_elementwise(log_r):
    assert kl.k3(np.array([log_r]))[0] >= 0.0
    assert kl.k3(np.array([log_r], dtype=np.float32))[0] >= 0.0


def test_k3_tiny_log_ratio_keeps_precision():
    # (e^x − 1) − x ≈ x²/2 for tiny x; the naive form would return 0 or a negative number
    assert kl.k3(np.array([1e-8]))[0] == pytest.approx(0.5e-16, rel=1e-6)
    assert kl.k3(np.array([0.0]))[0] == 0.0


def test_estimators_by_hand():
    log_r = np.array([math.log(2.0), math.log(0.5)])
    np.testing.assert_allclose(kl.k1(log_r), [-math.log(2), math.log(2)])
    np.testing.assert_allclose(kl.k2(log_r), [0.5 * math.log(2) ** 2] * 2)
    np.testing.assert_allclose(kl.k3(log_r), [1 - math.log(2), -0.5 + math.log(2)])
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl.estimator("k4")


def test_k2_bias_grows_with_the_kl():
    """E_q[k2] = Σ q ½ (log p/q)² (computed here independently) matches the estimator in Monte Carlo,
    and |E[k2] − KL| grows as the distributions move apart while it is negligible when close."""
    p = np.full(5, 0.2)
    v = np.array([2.0, 1.0, 0.0, -1.0, -2.0])
    rng = np.random.default_rng(7)
    biases, kls = [], []
    for t in (0.05, 0.3, 0.8, 1.5):
        q = np.exp(t * v) / np.exp(t * v).sum()
        exact_kl = float(np.sum(q * np.log(q / p)))
        exact_k2 = float(np.sum(q * 0.5 * np.log(p / q) ** 2))
        x = rng.choice(5, size=100_000, p=q)
        tokens = kl.reverse_kl_tokens(np.log(q[x]), np.log(p[x]), "k2")
        _mc_check(tokens, exact_k2)
        kls.append(exact_kl)
        biases.append(abs(exact_k2 - exact_kl))
    assert kls == sorted(kls)
    assert biases == sorted(biases) and biases[-1] > 10 * biases[0]
    assert biases[0] / kls[0] < 0.02          # nearby distributions: k2 ≈ KL
    assert biases[-1] / kls[-1] > 0.1         # far apart: a visible bias


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_numpy_and_torch_give_the_same_estimates(name):
    # one formula, two backends: float64 numpy and float64 torch agree (to an ulp: their expm1s
    # differ there), the torch result keeps its graph, and float32 stays float32 in both
    import torch

    rng = np.random.default_rng(3)
    log_r = rng.normal(0.0, 1.5, size=(4, 9))
    got_np = kl.estimator(name)(log_r)
    t = torch.tensor(log_r, requires_grad=True)
    got_t = kl.estimator(name)(t)
    assert isinstance(got_np, np.ndarray) and isinstance(got_t, torch.Tensor)
    np.testing.assert_allclose(got_t.detach().numpy(), got_np, rtol=1e-15, atol=0)
    got_t.sum().backward()  # d/dx: k1 −1, k2 x, k3 e^x − 1
    want_grad = {"k1": -np.ones_like(log_r), "k2": log_r, "k3": np.expm1(log_r)}[name]
    np.testing.assert_allclose(t.grad.numpy(), want_grad, rtol=1e-12)
    assert kl.estimator(name)(log_r.astype(np.float32)).dtype == np.float32
    assert kl.estimator(name)(t.detach().float()).dtype == torch.float32


def test_numpy_and_torch_agree_on_k4_and_k5():
    import torch

    rng = np.random.default_rng(4)
    logits_p, logits_q = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    logp = logits_p - np.log(np.exp(logits_p).sum(-1, keepdims=True))
    logq = logits_q - np.log(np.exp(logits_q).sum(-1, keepdims=True))
    np.testing.assert_allclose(kl.exact_kl_from_logprobs(torch.tensor(logp), torch.tensor(logq)).numpy(),
                               kl.exact_kl_from_logprobs(logp, logq), rtol=1e-12)
    np.testing.assert_allclose(kl.next_token_forward_kl_is_tokens(torch.tensor(logp), torch.tensor(logq)).numpy(),
                               kl.next_token_forward_kl_is_tokens(logp, logq), rtol=1e-12)
