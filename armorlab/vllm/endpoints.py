"""Where a job's vLLM servers listen: handed from the sweep job to the trainer (torch-free).

A profile with ``vllm_servers:`` (armorlab.vllm.servers) makes each job start its vLLM
server(s) on the node before the trainer, on ports it picks at start. The trainer learns them
from ``$ARMORLAB_VLLM_ENDPOINTS`` (JSON: config key → value), applied on top of the run's
config.yaml when the job starts. They are not part of the run's identity: the run dir's config
says *that* rollouts come from a server (``vllm_mode: server``, ``ref_vllm_mode: server``), the
job says *where* this attempt's servers listen, which may differ after a requeue.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from armorlab.errors import ArmorLabError

ENV = "ARMORLAB_VLLM_ENDPOINTS"
ROLES = ("policy", "ref")
# role → (host key, port key) of the run config that the trainer reads
KEYS: dict[str, tuple[str, str]] = {
    "policy": ("vllm_server_host", "vllm_server_port"),
    "ref": ("ref_vllm_server_host", "ref_vllm_server_port"),
}
ALL_KEYS = frozenset(k for pair in KEYS.values() for k in pair)


def endpoint_config(endpoints: Mapping[str, tuple[str, int]]) -> dict[str, Any]:
    """``{role: (host, port)}`` → the config keys the trainer reads."""
    out: dict[str, Any] = {}
    for role, (host, port) in endpoints.items():
        host_key, port_key = KEYS[role]
        out[host_key], out[port_key] = host, int(port)
    return out


def read_endpoints(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The config keys ``$ARMORLAB_VLLM_ENDPOINTS`` sets ({} when unset); only host/port keys."""
    env = os.environ if env is None else env
    raw = env.get(ENV)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ArmorLabError("must be a JSON object of config keys", key=ENV, value=raw)
    for key, value in data.items():
        if key not in ALL_KEYS:
            raise ArmorLabError(f"only the vLLM server host/port keys may be set ({', '.join(sorted(ALL_KEYS))})",
                                key=f"{ENV}.{key}", value=value)
        ok = isinstance(value, str) if key.endswith("_host") else \
            (isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536)
        if not ok:
            raise ArmorLabError("must be a host name" if key.endswith("_host") else "must be a TCP port",
                                key=f"{ENV}.{key}", value=value)
    return data
