"""The KL estimators the trainer logs, against the exact KL of a tiny model (both directions).

Two tiny Llama LMs p and q over a 6-token vocabulary (q = p with perturbed weights), two
prompts of different lengths (left padding), completions of at most 3 tokens ending at eos.
Every complete sequence can be enumerated, so the sequence-level truth
KL(p‖q) = Σ_y p(y)·log(p(y)/q(y)) is exact. Completions are drawn with the sampler the trainer
uses for π_ref (transformers ``generate`` at temperature T) and scored teacher-forced in the
layout the trainer uses (``pack_rows``); ``sequence_kl_estimates`` then gives the per-sequence
sums the trainer logs as ``kl/reverse_k*`` (samples of π_θ) and ``kl/forward_k*`` (unconditioned
samples of π_ref). Unbiased estimators must land within 4 Monte Carlo standard errors of the
truth; k2 is biased and must match its own enumerated expectation instead.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from armorlab.train.anchors import TransformersSampler, pack_rows
from armorlab.train.evaluation import sequence_exact_kl
from armorlab.train.telemetry import sequence_kl_estimates

PAD, EOS, VOCAB, MAX_NEW, TEMPERATURE = 0, 1, 6, 3, 0.7
PROMPTS = [[2], [3, 4, 5]]
SAMPLES_PER_PROMPT = 4000
Z = 4.0  # tolerance in Monte Carlo standard errors


class _Tokenizer:
    pad_token_id = PAD

    @staticmethod
    def batch_decode(ids, skip_special_tokens=True):
        return [" ".join(map(str, row)) for row in ids]


def _tiny_pair() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=8, max_position_embeddings=16,
                      initializer_range=0.3, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=2,
                      tie_word_embeddings=False)
    p = LlamaForCausalLM(cfg).eval()
    q = LlamaForCausalLM(cfg).eval()
    q.load_state_dict(p.state_dict())
    with torch.no_grad():
        for w in q.parameters():
            w.add_(0.06 * torch.randn_like(w))
    return p, q


@torch.no_grad()
def _token_logps(model, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """log model(y_t | prompt, y<t) at temperature T for each completion token, and the token mask."""
    ids, att, comp_mask = pack_rows(rows, PAD)
    width = comp_mask.size(1)
    logits = model(input_ids=ids, attention_mask=att).logits[:, ids.size(1) - width - 1:-1] / TEMPERATURE
    logps = torch.log_softmax(logits.double(), -1).gather(-1, ids[:, -width:].unsqueeze(-1)).squeeze(-1)
    return logps * comp_mask, comp_mask


def _complete_sequences() -> list[tuple[int, ...]]:
    """Every completion the sampler can return: up to and including the first eos, at most MAX_NEW tokens."""
    out = set()
    for tokens in itertools.product(range(VOCAB), repeat=MAX_NEW):
        cut = tokens.index(EOS) + 1 if EOS in tokens else MAX_NEW
        out.add(tokens[:cut])
    return sorted(out)


def _exact(p, q) -> dict[str, float]:
    """Enumerated over all complete sequences, averaged over the prompts (each prompt weighs the same)."""
    kl = k2 = 0.0
    seqs = _complete_sequences()
    for prompt in PROMPTS:
        rows = [(prompt, list(y)) for y in seqs]
        lp, mask = _token_logps(p, rows)
        lq, _ = _token_logps(q, rows)
        weight = lp.sum(-1).exp()
        assert float(weight.sum()) == pytest.approx(1.0, abs=1e-9)  # the enumeration is complete
        kl += float(weight @ (lp.sum(-1) - lq.sum(-1))) / len(PROMPTS)
        k2 += float(weight @ (0.5 * ((lq - lp) * mask).square().sum(-1))) / len(PROMPTS)
    return {"kl": kl, "k2": k2}


def _draw(model, seed: int):
    torch.manual_seed(seed)
    gen = GenerationConfig(max_new_tokens=MAX_NEW, do_sample=True, temperature=TEMPERATURE, top_k=None, top_p=None,
                           pad_token_id=PAD, eos_token_id=EOS)
    sampler = TransformersSampler(model, _Tokenizer(), gen, [EOS], batch_size=2 * SAMPLES_PER_PROMPT)
    return sampler.sample(PROMPTS, SAMPLES_PER_PROMPT)


@pytest.fixture(scope="module")
def pair():
    p, q = _tiny_pair()
    exact = {"p||q": _exact(p, q), "q||p": _exact(q, p)}
    return p, q, exact, {"p": _draw(p, seed=11), "q": _draw(q, seed=12)}


def _estimates(sampling, other, draws):
    rows = [(prompt, list(c.ids)) for prompt, group in zip(PROMPTS, draws, strict=True) for c in group]
    sample_logp, mask = _token_logps(sampling, rows)
    other_logp, _ = _token_logps(other, rows)
    totals, count = sequence_kl_estimates(sample_logp, other_logp, mask)
    # per-sequence values by hand, only for the standard errors
    log_r = (other_logp - sample_logp) * mask
    per_seq = {"k1": -log_r.sum(-1), "k2": 0.5 * log_r.square().sum(-1),
               "k3": ((log_r.exp() - 1.0 - log_r) * mask).sum(-1)}
    n = float(count)
    means = dict(zip(("k1", "k2", "k3"), (t / n for t in totals.tolist()), strict=True))
    ses = {k: float(v.std()) / math.sqrt(n) for k, v in per_seq.items()}
    for k, v in per_seq.items():  # the estimator function agrees with the hand formula
        assert means[k] == pytest.approx(float(v.mean()), rel=1e-4, abs=1e-7)
    return means, ses, n


@pytest.mark.parametrize("direction", ["reverse", "forward"])
def test_estimators_match_the_exact_kl_of_a_tiny_model(pair, direction):
    p, q, exact, draws = pair
    # reverse: sequences from the policy (p = π_θ) scored against π_ref (q); forward: sequences
    # from the reference (q = π_ref), unconditioned, scored against the policy p
    sampling, other, truth, drawn = ((p, q, exact["p||q"], draws["p"]) if direction == "reverse"
                                     else (q, p, exact["q||p"], draws["q"]))
    means, ses, n = _estimates(sampling, other, drawn)
    assert n == len(PROMPTS) * SAMPLES_PER_PROMPT
    for k in ("k1", "k3"):
        assert abs(means[k] - truth["kl"]) <= Z * ses[k], (k, means[k], truth["kl"], ses[k])
    assert abs(means["k2"] - truth["k2"]) <= Z * ses["k2"], (means["k2"], truth["k2"], ses["k2"])
    # the test can tell the directions apart: the other direction's truth is far outside the band
    wrong = exact["q||p"]["kl"] if direction == "reverse" else exact["p||q"]["kl"]
    assert abs(wrong - truth["kl"]) > 3 * Z * ses["k3"]


def test_exact_kl_probe_agrees_with_the_enumeration(pair):
    p, q, exact, drawn = pair
    chunks = 10
    per = SAMPLES_PER_PROMPT // chunks
    means = []
    for c in range(chunks):  # batch means give the probe's own Monte Carlo error
        part = [group[c * per:(c + 1) * per] for group in drawn["p"]]
        total, count = sequence_exact_kl(p, q, PROMPTS, part, temperature=TEMPERATURE, pad_token_id=PAD,
                                         batch_size=len(PROMPTS) * per)
        means.append(total / count)
    mean = sum(means) / chunks
    se = math.sqrt(sum((m - mean) ** 2 for m in means) / (chunks - 1) / chunks)
    assert abs(mean - exact["p||q"]["kl"]) <= Z * se


# --------------------------------------------------------------------------- verl's low_var_kl
def _verl_kl_penalty():
    """verl 0.9.1's own ``kl_penalty`` and ``kl_penalty_forward``, compiled from its
    ``core_algos.py`` (shipped as source under the venv's share/verl; verl itself is not installed)."""
    import ast
    import sys
    from pathlib import Path

    path = Path(sys.prefix) / "share/verl/verl/trainer/ppo/core_algos.py"
    if not path.is_file():
        pytest.skip(f"verl 0.9.1 source not found at {path}")
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("kl_penalty", "kl_penalty_forward")]
    for node in keep:
        node.decorator_list = []
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["kl_penalty"]


def _log_probs(seed: int):
    """Policy/reference log-probs whose log-ratio spans (−30, 30): both of verl's clamps bind."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(64, 7, generator=g, dtype=torch.float64) * 30
    ref = -torch.rand(64, 7, generator=g, dtype=torch.float64) * 30
    return logp.float(), ref.float()


@pytest.mark.parametrize("seed", [0, 1])
def test_low_var_kl_is_verls_kl_penalty_bit_for_bit(seed):
    from armorlab.algos import kl

    logp, ref = _log_probs(seed)
    logp.requires_grad_(True)
    ours = kl.estimator("low_var_kl")(ref - logp)
    verl = _verl_kl_penalty()(logp, ref, "low_var_kl")
    # the same formula stated independently: l = clamp(ref − logp, ±20); clamp(e^l − l − 1, ±10)
    l_ = torch.clamp(ref - logp.detach(), -20.0, 20.0)
    by_hand = torch.clamp(torch.exp(l_) - l_ - 1, -10.0, 10.0)
    assert torch.equal(ours.detach(), verl.detach()) and torch.equal(ours.detach(), by_hand)
    assert bool((by_hand == 10.0).any()) and bool((ref - logp > 20).any())  # both clamps bind here
    g_ours, = torch.autograd.grad(ours.sum(), logp)
    g_verl, = torch.autograd.grad(_verl_kl_penalty()(logp, ref, "low_var_kl").sum(), logp)
    assert torch.equal(g_ours, g_verl)
    assert float(g_ours[by_hand == 10.0].abs().max()) == 0.0  # no gradient where the value clamp binds
    # unclamped k3 differs exactly where a clamp binds, so the comparison can fail
    assert not torch.equal(kl.estimator("k3")(ref - logp).detach(), ours.detach())
    np_ours = kl.low_var_kl((ref - logp).detach().numpy())
    assert np.allclose(np_ours, by_hand.numpy(), rtol=0, atol=1e-5)  # numpy's float32 exp differs by ulps


def test_low_var_kl_is_a_config_choice():
    from armorlab.core.config import resolve
    from armorlab.errors import ArmorLabError

    assert resolve({"beta": 0.01, "kl_estimator": "low_var_kl"})["kl_estimator"] == "low_var_kl"
    with pytest.raises(ArmorLabError, match="kl_estimator"):
        resolve({"beta": 0.01, "kl_estimator": "k4"})
