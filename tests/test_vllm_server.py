"""vLLM servers (``ref_vllm_mode: server``, ``use_vllm: true, vllm_mode: server``) on the tiny model: `make test-vllm`.

One real server (`armorlab vllm-serve`, fp32, loopback, a free port) is shared by the module. A
trainer pushes its own weights before it samples (π_ref once at set-up, the policy at its first
generation), so the reference tests and the policy test can use it one after the other; one
server for both at once is refused by the config (the policy's syncs would overwrite π_ref).
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from tests.trainer_support import (
    AnswerSampler,
    answer_table,
    build,
    capturing,
    hf_logps,
    max_gap,
    model_cache,
    perturbed_copy,
    resolved,
    tokenizer_for,
)

pytestmark = pytest.mark.vllm
STARTUP_S = 600  # ~50-100 s on 2 busy cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


server_log = {}  # port → the server's log (uvicorn logs every request)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(host, port) of `armorlab vllm-serve` serving the tiny model in fp32 (the trainer's dtype)."""
    from armorlab.train.models import prepare_model

    cfg = resolved()
    model = str(prepare_model(cfg["model"], cfg["task"], cache_dir=model_cache()))
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the engine process users get (test_vllm.py sets it to 0)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "armorlab", "vllm-serve", "--model", model, "--host",
                                 "127.0.0.1", "--port", str(port), "--dtype", "float32"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                pytest.fail(f"vllm-serve did not come up (rc={proc.poll()}):\n{tail}")
            time.sleep(2)
        server_log[port] = log
        yield "127.0.0.1", port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its engine process: the group this fixture started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _server_logps(client, rows):
    """Each token's log-prob after the first, scored by the server (prompt_logprobs, temperature 1)."""
    out = client._post(f"{client.base_url}/v1/completions",
                       json={"model": client.model, "prompt": rows, "max_tokens": 1, "temperature": 1.0,
                             "prompt_logprobs": 0})
    return [torch.tensor([c["prompt_logprobs"][i][str(t)]["logprob"] for i, t in enumerate(ids) if i > 0])
            for c, ids in zip(out["choices"], rows, strict=True)]


def _rows(tok):
    return [tok(p + a)["input_ids"] for p, a in (("12+7=", "19"), ("3*4=", "12"), ("40-8=", "32"))]


@pytest.fixture(scope="module")
def trained(server, tmp_path_factory):
    """ARMOR, anchors from the reference server, π_ref reset every step, 2 steps."""
    Capture = capturing("armorlab_is_anchor", "completion_mask")

    host, port = server
    cfg = resolved(objective="armor", max_steps=2, ref_reset_steps=1, ref_vllm_mode="server",
                   ref_vllm_server_host=host, ref_vllm_server_port=port)
    trainer = build(tmp_path_factory.mktemp("vllm-server-ref"), cfg, trainer_cls=Capture)
    trainer.captured = []
    trainer.train()
    sampler = trainer.reference_sampler
    # as training left them (the server is shared with the policy test, which runs in any order)
    trainer.trained_counts = (sampler.generate_calls, sampler.prompts_sent, sampler.client.weight_pushes,
                              trainer.anchor_rollout.rounds)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    trainer.trained_gap = max_gap(_server_logps(sampler.client, _rows(trainer._tokenizer)),
                                   hf_logps(policy, _rows(trainer._tokenizer)))
    return trainer


def test_armor_trains_with_anchors_from_the_reference_server(trained):
    from armorlab.train.vllm_reference import VLLMServerReferenceSampler

    assert isinstance(trained.reference_sampler, VLLMServerReferenceSampler)
    assert trained.state.global_step == 2 and trained.reference.resets == 2
    generate_calls, prompts_sent, pushes, rounds = trained.trained_counts
    # one batched request per sampling round (adaptive rejection, ≤ 3 rounds at k = 4) of the one
    # generation batch (2 steps per generation)
    assert 1 <= generate_calls == rounds <= 3
    assert 0 < prompts_sent <= 16 * 2 // 8 * rounds  # groups of the batch, fewer in later rounds
    assert pushes == 1 + 2  # this run's π_ref at set-up, then one per reset
    anchors = sum(int(c["armorlab_is_anchor"].sum()) for c in trained.captured)
    assert anchors > 0, "the warm-started reference found no correct sample: nothing was anchored"
    for c in trained.captured:
        for row in c["armorlab_is_anchor"].nonzero().flatten().tolist():
            assert 0 < int(c["completion_mask"][row].sum()) <= trained.args.max_completion_length
    losses = [h["loss"] for h in trained.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


def test_after_a_reset_the_server_scores_like_the_policy(trained):
    sampler, tok = trained.reference_sampler, trained._tokenizer
    rows = _rows(tok)
    policy = trained.accelerator.unwrap_model(trained.model)
    moved = perturbed_copy(policy)
    sampler.sync_from(policy)  # whatever another test left on the shared server
    gap_stale = max_gap(_server_logps(sampler.client, rows), hf_logps(moved, rows))
    sampler.sync_from(moved)
    gap_pushed = max_gap(_server_logps(sampler.client, rows), hf_logps(moved, rows))
    print(f"logp gaps: trained={trained.trained_gap:.2e} stale={gap_stale:.2e} pushed={gap_pushed:.2e}")
    assert gap_stale > 1e-2, "the perturbation did not change the log-probs: the check would be vacuous"
    assert trained.trained_gap <= 1e-4  # the last step's reset pushed the policy
    assert gap_pushed <= 1e-4


def test_cached_prompts_are_not_sent_to_the_server(trained):
    from armorlab.train.anchors import AnchorCache, AnchorRollout, GroupRequest

    sampler, tok = trained.reference_sampler, trained._tokenizer
    posts = []
    session_post = sampler.client.session.post

    def counting_post(url, **kwargs):
        if url.endswith("/v1/completions"):
            posts.append(list(kwargs["json"]["prompt"]))
        return session_post(url, **kwargs)

    sampler.client.session.post = counting_post
    try:
        def req(text):
            return GroupRequest(text, tok(text)["input_ids"])

        def score(requests, samples):
            return [[1.0] * len(s) for s in samples]

        rollout = AnchorRollout(sampler, score, k=3, anchor_filter="correct", threshold=1.0, cache=AnchorCache(),
                                adaptive=True)  # anchor_rounds: adaptive, so each call sends what the cache lacks
        # every sample scores 1: each prompt's first draw is its anchor (one round, one sample each)
        outcomes, generated = rollout.run([req("1+1="), req("2+2="), req("1+1=")], seed=0, step=0)
        assert posts == [[tok("1+1=")["input_ids"], tok("2+2=")["input_ids"]]] and generated == 2
        assert [o.cached for o in outcomes] == [False, False, True] and all(len(o.fresh) == 1 for o in outcomes[:2])
        outcomes, generated = rollout.run([req("2+2="), req("5+5="), req("1+1=")], seed=0, step=1)
        assert posts[1:] == [[tok("5+5=")["input_ids"]]] and generated == 1
        outcomes, generated = rollout.run([req("2+2="), req("1+1=")], seed=0, step=2)
        assert len(posts) == 2 and generated == 0  # everything cached: no request at all
    finally:
        sampler.client.session.post = session_post


def test_policy_rollouts_from_the_server_train_with_anchors_and_the_correction_skips_them(server, tmp_path):
    from armorlab.train.vllm_client import WeightSyncClient

    Capture = capturing("armorlab_is_anchor", "importance_sampling_ratio")

    host, port = server
    cfg = resolved(objective="armor", max_steps=2, use_vllm=True, vllm_mode="server", vllm_server_host=host,
                   vllm_server_port=port, vllm_importance_sampling_mode="token_truncate")
    table = answer_table(cfg)
    sampler = AnswerSampler(tokenizer_for(cfg), table.__getitem__)  # always correct: every group is anchored
    trainer = build(tmp_path, cfg, trainer_cls=Capture, sampler=sampler)
    client = trainer.vllm_generation.vllm_client
    assert trainer.vllm_generation.mode == "server" and isinstance(client, WeightSyncClient)
    trainer.captured = []
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.captured
    assert client.weight_pushes == 1  # TRL syncs before each generation: one generation batch in 2 steps
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    for out in trainer.captured:
        ratio, anchor = out["importance_sampling_ratio"], out["armorlab_is_anchor"]
        assert int(anchor.sum()) == anchor.numel() // trainer.num_generations  # one anchor per group
        assert torch.equal(ratio[anchor], torch.ones_like(ratio[anchor]))  # not sampled by the server
        on = ratio[~anchor]  # the server's fp32 log-probs against the trainer's: 1 up to rounding
        assert bool(torch.isfinite(on).all()) and float((on - 1).abs().max()) < 1e-3
        assert bool((on != 1).any()), "the policy rows were not corrected: the anchor check would be vacuous"
    client.close_communicator()
    assert client.sync_dir is None


@pytest.mark.parametrize(("overrides", "key"), [
    ({"ref_vllm_mode": "server", "ref_vllm_server_host": "127.0.0.1", "ref_vllm_server_timeout": 0},
     "ref_vllm_server_port"),
    ({"use_vllm": True, "vllm_mode": "server", "vllm_server_host": "127.0.0.1", "vllm_server_timeout": 0.5},
     "vllm_server_port"),
])
def test_a_server_that_does_not_answer_is_an_error_naming_its_key(tmp_path, overrides, key):
    from armorlab.errors import ArmorLabError

    port = _free_port()  # nothing listens there
    cfg = resolved(objective="armor", max_steps=1, **overrides, **{key: port})
    with pytest.raises(ArmorLabError, match="armorlab vllm-serve") as err:
        build(tmp_path, cfg)
    assert err.value.key == key and err.value.value == port and f"127.0.0.1:{port}" in str(err.value)


def _requests(port: int, path: str) -> int:
    """How many requests for ``path`` the server has logged."""
    return server_log[port].read_text(errors="replace").count(f'"POST {path} HTTP')


def test_two_processes_sample_from_the_reference_server_and_only_rank_0_pushes(server, tmp_path):
    """torchrun, 2 CPU processes (gloo), 12 rows each with G = 8: a group straddles the processes."""
    import yaml

    from armorlab.core.runs import RunDir
    from tests.test_equivalence import torchrun
    from tests.trainer_support import TASK

    host, port = server
    cfg = {"objective": "armor", "ref_reset_steps": 1, "max_steps": 2, "seed": 0, "val_every": 0,
           "kl_probe_prompts": 0, "save_steps": 1000, "per_device_train_batch_size": 12, "num_generations": 8,
           "steps_per_generation": 1, "task": dict(TASK), "ref_vllm_mode": "server",
           "ref_vllm_server_host": host, "ref_vllm_server_port": port}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    pushes, resets, generates = (_requests(port, p) for p in ("/collective_rpc", "/reset_prefix_cache",
                                                               "/v1/completions"))
    proc = torchrun(2, "-m", "armorlab", "train", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [RunDir(p) for p in (tmp_path / "runs").iterdir()]
    assert run.read_status()["state"] == "completed"
    rows = run.read_metrics()
    assert sum(r.get("anchor/ref_samples", 0) for r in rows) > 0
    # π_ref at set-up and at each of the 2 resets, pushed by rank 0 alone (rank 1 only waits for it)
    assert (_requests(port, "/collective_rpc") - pushes, _requests(port, "/reset_prefix_cache") - resets) == (3, 3)
    assert _requests(port, "/v1/completions") > generates  # both ranks sample through the server
