"""TRL's ``VLLMClient`` with a CPU weight sync: the client object TRL's server mode builds.

On a CUDA device every method is TRL's own (NCCL weight-transfer engine, unchanged). Without
one, TRL's ``init_communicator`` raises ``NotImplementedError``: vLLM 0.32's weight-transfer
backends (nccl, ipc, sparse_nccl, nccl_m2n, sharded_rdt, modelexpress) all move CUDA tensors.
:class:`WeightSyncClient` then syncs through the file system of the node instead: the trainer
writes the tensors TRL streams to ``<dir>/model.safetensors`` (atomic rename) and asks the server,
through the dev-mode ``/collective_rpc`` endpoint, to run vLLM's own worker method
``reload_weights(weights_path=<dir>)`` — the in-place reload (the model's ``load_weights`` plus the
backend's re-packing) that also works in fp32 on vLLM's CPU backend. TRL's callers
(``VLLMGeneration.sync_weights``: ``update_named_params`` then ``reset_prefix_cache``) are unchanged.
The trainer and the server must share that directory: one node (``/tmp``), or
``$ARMORLAB_VLLM_SYNC_DIR`` on a shared file system.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import torch
from trl.generation import vllm_generation
from trl.generation.vllm_client import VLLMClient

from armorlab.errors import ArmorLabError
from armorlab.vllm.env import LOOPBACK_ENV, is_loopback

WEIGHTS_FILE = "model.safetensors"
SYNC_DIR_ENV = "ARMORLAB_VLLM_SYNC_DIR"


class WeightSyncClient(VLLMClient):
    """``VLLMClient`` whose weight sync falls back to a safetensors file + ``reload_weights`` off CUDA.

    ``sync_dir`` is set by :meth:`init_communicator` when the file path is taken (None: TRL's NCCL).
    """

    sync_dir: str | None = None
    weight_pushes = 0

    def init_communicator(self, device: torch.device | str | int = 0) -> None:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if device.type == "cuda":
            # TRL names the group's address with vLLM's get_ip(), which reads VLLM_HOST_IP: a server on
            # this node's loopback must be told the loopback address, as on CPU
            if is_loopback(urlsplit(self.base_url).hostname):
                for key, value in LOOPBACK_ENV.items():
                    os.environ.setdefault(key, value)
            super().init_communicator(device)
            return
        self.get_server_info()  # a clear error when the server lacks the dev-mode endpoints
        self.sync_dir = tempfile.mkdtemp(prefix="armorlab-vllm-weights-", dir=os.environ.get(SYNC_DIR_ENV) or None)
        atexit.register(self.close_communicator)

    def update_named_params(self, metadata: list[tuple[str, str, list[int]]],
                            named_params: Iterator[tuple[str, torch.Tensor]]) -> None:
        if self.sync_dir is None:
            super().update_named_params(metadata, named_params)
            return
        from safetensors.torch import save_file

        tensors = {name: t.detach().to("cpu").contiguous() for name, t in named_params}
        partial = os.path.join(self.sync_dir, WEIGHTS_FILE + ".partial")
        save_file(tensors, partial)
        os.replace(partial, os.path.join(self.sync_dir, WEIGHTS_FILE))  # the server never reads half a file
        self._post(f"{self.base_url}/collective_rpc",
                   json={"method": "reload_weights", "kwargs": {"weights_path": self.sync_dir}})
        self.weight_pushes += 1

    def close_communicator(self) -> None:
        if self.sync_dir is not None:
            shutil.rmtree(self.sync_dir, ignore_errors=True)
            self.sync_dir = None
        super().close_communicator()


def unreachable(exc: Exception, *, base_url: str | None, host: str, port: int, timeout: float,
                prefix: str) -> ArmorLabError:
    """The error for a server that did not answer, naming the ``<prefix>server_*`` key that points at it."""
    url = base_url or f"http://{host}:{port}"
    key = f"{prefix}server_base_url" if base_url else f"{prefix}server_port"
    return ArmorLabError(f"no vLLM server answers at {url} within {timeout:g} s ({exc}); start one with "
                         "`armorlab vllm-serve --model <the policy's model> --port <port>`",
                         key=key, value=base_url or port)


@contextlib.contextmanager
def trl_builds_weight_sync_clients(args: Any) -> Iterator[None]:
    """While TRL sets up ``VLLMGeneration`` (server mode), the client it builds is a :class:`WeightSyncClient`.

    TRL builds and connects the client inside ``VLLMGeneration.__init__`` with no seam for the class;
    swapping the module's name for the duration of the set-up is the narrowest hook. A server that
    does not answer is an :class:`ArmorLabError` naming TRL's ``vllm_server_*`` key.
    """
    try:
        from requests.exceptions import ConnectionError as Unreachable
    except ImportError:  # then TRL's VLLMClient refuses to start, saying so
        Unreachable = ()
    original = vllm_generation.VLLMClient
    vllm_generation.VLLMClient = WeightSyncClient
    try:
        yield
    except Unreachable as exc:
        raise unreachable(exc, base_url=args.vllm_server_base_url, host=args.vllm_server_host,
                          port=args.vllm_server_port, timeout=args.vllm_server_timeout, prefix="vllm_") from None
    finally:
        vllm_generation.VLLMClient = original


def connect(*, base_url: str | None, host: str, port: int, group_port: int, timeout: float,
            device: Any) -> WeightSyncClient:
    """A connected client, weight sync set up for ``device`` (TRL's NCCL group on CUDA, the file path off
    it; None: generation only)."""
    client = WeightSyncClient(base_url=base_url, host=host, server_port=port, group_port=group_port,
                              connection_timeout=timeout)
    if device is not None:
        client.init_communicator(device=device)
    return client
