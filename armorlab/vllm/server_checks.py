"""Whether a sweep's runs and its profile agree on vLLM servers (`armorlab sweep` checks this while
planning, before anything is written). Apart from armorlab.vllm.servers, which starts and
stops the servers: planning a sweep never imports that."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from armorlab.core.config import FIELDS
from armorlab.errors import ArmorLabError
from armorlab.vllm.endpoints import KEYS as ENDPOINT_KEYS
from armorlab.vllm.endpoints import ROLES

if TYPE_CHECKING:
    from armorlab.vllm.servers import ServerSet

def uses(cfg: Mapping[str, Any], role: str) -> bool:
    """Whether a resolved run config generates through a server of ``role``."""
    if role == "policy":
        return bool(cfg.get("use_vllm")) and cfg.get("vllm_mode") == "server"
    return cfg.get("ref_vllm_mode") == "server"


# TRL 1.16's defaults of the keys that say where the policy server listens
_TRL_DEFAULTS = {"vllm_server_host": "0.0.0.0", "vllm_server_port": 8000, "vllm_server_base_url": None}


def _set_by_run(cfg: Mapping[str, Any], key: str) -> bool:
    """``key`` holds a value of the run's own (a resolved config may carry defaults)."""

    default = FIELDS[key].default if key in FIELDS else _TRL_DEFAULTS.get(key)
    return key in cfg and cfg[key] != default


def check_runs(servers: ServerSet | None, runs: Iterable[Any], *, profile_file: str, spec_file: str | None,
               executor: str = "slurm") -> None:
    """Each run uses exactly the servers the profile starts (``runs``: RunPlans or configs). A run in
    server mode without a profile server must say where its server listens, except on the local
    executor (a server the user started on this machine at TRL's default address)."""
    started = set(servers.roles()) if servers else set()
    for run in runs:
        cfg = getattr(run, "view", None) or getattr(run, "config", run)  # a RunPlan's view: no copy
        rid = getattr(run, "run_id", "?")
        for role in ROLES:
            if role not in started and not uses(cfg, role):
                continue  # none of the checks below applies (the common case: no server anywhere)
            host_key, port_key = ENDPOINT_KEYS[role]
            mode = ("vllm_mode", "server") if role == "policy" else ("ref_vllm_mode", "server")
            switch = "use_vllm: true and vllm_mode: server" if role == "policy" else "ref_vllm_mode: server"
            own = [k for k in (host_key, port_key, "vllm_server_base_url" if role == "policy" else None)
                   if k and _set_by_run(cfg, k)]
            if role in started and not uses(cfg, role):
                spec = next(s for s in servers.servers if s.role == role)
                raise ArmorLabError(f"the profile starts a vLLM {role} server on every job's node, but run {rid} "
                                    f"does not generate through it: give the runs {switch}, or drop "
                                    f"vllm_servers.{role} from the profile", key=f"vllm_servers.{role}",
                                    value={"gpus": spec.gpus, "port": spec.port or "auto"}, file=profile_file)
            if role in started and own:
                raise ArmorLabError(f"run {rid} sets where its {role} server listens, but the job starts that "
                                    "server itself and sets it: remove the key from the spec", key=own[0],
                                    value=cfg[own[0]], file=spec_file)
            if role not in started and uses(cfg, role) and not own and executor == "slurm":
                raise ArmorLabError(f"run {rid} generates through a vLLM {role} server, which profile "
                                    f"{profile_file} does not start: add vllm_servers.{role} to the profile "
                                    "(see slurm/gpu-8x-vllm.yaml) or set where the server listens",
                                    key=mode[0], value=mode[1], file=spec_file)


