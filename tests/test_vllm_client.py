"""armorlab's VLLMClient: TRL's own methods on CUDA, the file + ``reload_weights`` sync off it (no server:
the HTTP calls are recorded). The real server path is tests/test_vllm_server.py."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file
from trl.generation import vllm_generation
from trl.generation.vllm_client import VLLMClient

from armorlab.train.vllm_client import WEIGHTS_FILE, WeightSyncClient, trl_builds_weight_sync_clients


def _client(calls):
    client = WeightSyncClient.__new__(WeightSyncClient)  # no server to connect to
    client.base_url = "http://127.0.0.1:1"
    client.communicator = None
    client._post = lambda url, **kw: calls.append((url.removeprefix(client.base_url), kw.get("json"))) or {}
    client.get_server_info = lambda: calls.append(("/server_info", None)) or {}
    return client


def test_on_cuda_every_sync_method_is_trls(monkeypatch):
    seen = []
    monkeypatch.setattr(VLLMClient, "init_communicator", lambda self, device=0: seen.append(("init", device)))
    monkeypatch.setattr(VLLMClient, "update_named_params", lambda self, meta, params: seen.append(("update", meta)))
    calls = []
    client = _client(calls)
    client.init_communicator(device=torch.device("cuda", 0))
    client.update_named_params([("w", "float32", [2])], iter([("w", torch.zeros(2))]))
    assert seen == [("init", torch.device("cuda", 0)), ("update", [("w", "float32", [2])])]
    assert client.sync_dir is None and calls == []


@pytest.mark.parametrize(("base_url", "expected"), [("http://127.0.0.1:8001", "127.0.0.1"),
                                                     ("http://localhost:8001", "127.0.0.1"),
                                                     ("http://10.1.2.3:8001", None)])
def test_on_cuda_a_loopback_server_gets_the_loopback_address_for_the_weight_sync_group(monkeypatch, base_url,
                                                                                      expected):
    """TRL's init_communicator names the NCCL group's address with vLLM's get_ip(), which reads
    VLLM_HOST_IP: for a server on this node's loopback it must be 127.0.0.1 (as on CPU)."""
    seen = []
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    monkeypatch.setattr(VLLMClient, "init_communicator",
                        lambda self, device=0: seen.append(os.environ.get("VLLM_HOST_IP")))
    client = _client([])
    client.base_url = base_url
    client.init_communicator(device=torch.device("cuda", 0))
    assert seen == [expected]


def test_off_cuda_the_weights_go_through_a_file_and_vllms_reload_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("ARMORLAB_VLLM_SYNC_DIR", str(tmp_path))
    calls = []
    client = _client(calls)
    client.init_communicator(device="cpu")
    assert client.sync_dir is not None and os.path.dirname(client.sync_dir) == str(tmp_path)
    weights = {"model.embed_tokens.weight": torch.arange(6.0).reshape(2, 3), "lm_head.weight": torch.ones(3, 2)}
    meta = [(n, "float32", list(t.shape)) for n, t in weights.items()]
    for round_ in range(2):  # the same file, replaced: the server reloads what this sync sent
        sent = {n: t + round_ for n, t in weights.items()}
        client.update_named_params(meta, iter(sent.items()))
        on_disk = load_file(os.path.join(client.sync_dir, WEIGHTS_FILE))
        assert on_disk.keys() == sent.keys() and all(torch.equal(on_disk[n], sent[n]) for n in sent)
    assert os.listdir(client.sync_dir) == [WEIGHTS_FILE]  # no partial file left behind
    rpc = ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": client.sync_dir}})
    assert calls == [("/server_info", None), rpc, rpc] and client.weight_pushes == 2
    sync_dir = client.sync_dir
    client.close_communicator()
    assert client.sync_dir is None and not os.path.exists(sync_dir)


def test_trl_builds_armorlabs_client_only_while_it_sets_up():
    original = vllm_generation.VLLMClient

    class Args:
        vllm_server_base_url, vllm_server_host, vllm_server_port, vllm_server_timeout = None, "h", 1, 0.0

    with trl_builds_weight_sync_clients(Args()):
        assert vllm_generation.VLLMClient is WeightSyncClient
    assert vllm_generation.VLLMClient is original
    with pytest.raises(RuntimeError), trl_builds_weight_sync_clients(Args()):
        raise RuntimeError("TRL's set-up failed")
    assert vllm_generation.VLLMClient is original
