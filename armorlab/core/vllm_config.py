"""Which vLLM server settings a resolved config may combine (torch-free; ``config.resolve`` calls it).

Two servers can be in play: the policy's (TRL's ``use_vllm: true, vllm_mode: server`` with
``vllm_server_*``) and π_ref's (``ref_vllm_mode: server`` with ``ref_vllm_server_*``).
"""

from __future__ import annotations

from typing import Any

from armorlab.core.trl_fields import OFF_SWITCHES
from armorlab.errors import ArmorLabError

# TRL's policy-server fields and their GRPOConfig defaults (TRL reads them only in server mode)
POLICY_SERVER_DEFAULTS: dict[str, Any] = {key: OFF_SWITCHES[key] for key in (
    "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port")}


def _address(base_url: Any, host: Any, port: Any) -> str:
    if base_url:
        return str(base_url).rstrip("/")
    return f"http://{host}:{port}"


def check_vllm_servers(cfg: dict[str, Any], file: str | None) -> None:
    """ArmorLabError for a server setting that would be ignored or a pair of servers that cannot work."""
    policy_server = bool(cfg.get("use_vllm")) and cfg.get("vllm_mode", "colocate") == "server"
    if cfg.get("vllm_mode", "colocate") == "server" and not cfg.get("use_vllm"):
        raise ArmorLabError("vllm_mode is only read with use_vllm: true (set it, or drop vllm_mode)",
                            key="vllm_mode", value=cfg["vllm_mode"], file=file)
    if not policy_server:
        for key in POLICY_SERVER_DEFAULTS:
            if key in cfg:  # TRL's default was dropped already: this one differs from it
                raise ArmorLabError("only read with use_vllm: true and vllm_mode: server (the policy's vLLM "
                                    "server); set those or drop it", key=key, value=cfg[key], file=file)
        return
    if cfg.get("ref_vllm_mode") != "server":
        return
    policy = {k: cfg.get(k, d) for k, d in POLICY_SERVER_DEFAULTS.items()}
    ref = _address(cfg["ref_vllm_server_base_url"], cfg["ref_vllm_server_host"], cfg["ref_vllm_server_port"])
    if ref == _address(policy["vllm_server_base_url"], policy["vllm_server_host"], policy["vllm_server_port"]):
        key = "ref_vllm_server_base_url" if cfg["ref_vllm_server_base_url"] else "ref_vllm_server_port"
        raise ArmorLabError(f"π_ref and the policy cannot share one vLLM server ({ref}): the policy's weights are "
                            "pushed into its server every step; start a second server for π_ref",
                            key=key, value=cfg[key], file=file)
    if cfg["ref_vllm_group_port"] == policy["vllm_group_port"]:
        raise ArmorLabError("the reference's weight-update group needs its own port (vllm_group_port is the "
                            "policy's)", key="ref_vllm_group_port", value=cfg["ref_vllm_group_port"], file=file)


def check_engine_parallelism(cfg: dict[str, Any], file: str | None) -> None:
    """Two colocated engines in one process share vLLM's process-wide parallel state, so their
    tensor-parallel sizes must agree (vLLM asserts it when the second engine starts)."""
    if cfg.get("ref_vllm_mode") != "colocate":
        return
    ref_tp = cfg.get("ref_vllm_tensor_parallel_size", 1)
    policy_colocated = bool(cfg.get("use_vllm")) and cfg.get("vllm_mode", "colocate") == "colocate"
    policy_tp = cfg.get("vllm_tensor_parallel_size", 1)
    if policy_colocated and ref_tp != policy_tp:
        raise ArmorLabError(f"the reference's colocated engine must use the policy engine's tensor-parallel size "
                            f"(vllm_tensor_parallel_size: {policy_tp}): vLLM's parallel state is one per process",
                            key="ref_vllm_tensor_parallel_size", value=ref_tp, file=file)


def check_args(args: Any) -> None:
    """:func:`check_vllm_servers` on a built ``ArmorLabConfig`` (Python users skip ``config.resolve``)."""
    keys = ("use_vllm", "vllm_mode", "ref_vllm_mode", "ref_vllm_server_host", "ref_vllm_server_port",
            "ref_vllm_server_base_url", "ref_vllm_group_port", "ref_vllm_tensor_parallel_size",
            "vllm_tensor_parallel_size", *POLICY_SERVER_DEFAULTS)
    cfg = {k: getattr(args, k) for k in keys if hasattr(args, k)}
    for key in [k for k in cfg if k in OFF_SWITCHES and cfg[k] == OFF_SWITCHES[k]]:
        del cfg[key]  # as config.resolve drops TRL's defaults
    check_vllm_servers(cfg, None)
    check_engine_parallelism(cfg, None)
