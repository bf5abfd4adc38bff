"""Cluster profiles (``slurm/*.yaml``): where and how a sweep's jobs run.

```yaml
executor: slurm             # default executor of `armorlab sweep` (the CLI's --executor wins)
workers: 1                  # local executor: parallel training processes
partition: gpu              # Slurm: partition, account, qos (null = cluster default)
account: null
qos: null
nodes: 1
gpus_per_node: 1
gpu_memory_gb: 80           # each GPU's memory in GiB (nvidia-smi's MiB / 1024): the memory plan's limit
cpus_per_task: 8
mem_gb: 64
time_min: 240               # per job; a job near its limit checkpoints and requeues itself
array_parallelism: 32       # at most this many array tasks run at once (sbatch --array=...%N)
signal_delay_s: 120         # the checkpoint signal comes this long before the time limit
max_num_timeout: 3          # requeues after time-outs before giving up (preemptions are unlimited)
max_array_size: null        # cap on array length; the cluster's MaxArraySize always applies
setup: [module load cuda/12.4, source .venv/bin/activate]   # shell lines run before the job
launcher: python            # or accelerate (multi-GPU / multi-node)
accelerate_config: null     # accelerate config file, required with launcher: accelerate
python: null                # python command on the nodes (default: this interpreter)
sbatch: {constraint: a100}  # any other sbatch option, passed through (values are shell-quoted)
allow_exports: []           # variables sbatch's export may set although they choose the code a job runs
                            # (PATH, PYTHONPATH, LD_*, BASH_ENV...: armorlab.core.checks.runs_code)
vllm_servers: null          # vLLM server(s) each job starts on its node first (armorlab.vllm.servers)
```
``setup`` and ``python`` are shell text written by the profile's author; nothing from a sweep
spec ever reaches the job script (a job finds its config in its run directory). No value that
reaches the script may hold a control character (a newline would end its ``#SBATCH`` line and
run the rest as shell code); the rendered script is checked line by line (armorlab.sweeps.sbatch).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from armorlab.core import checks
from armorlab.core.checks import Invalid, choice, integer, text
from armorlab.core.config import load_yaml_mapping
from armorlab.errors import ArmorLabError
from armorlab.sweeps.sbatch import script_value

if TYPE_CHECKING:  # imported where a profile has vllm_servers: `sweep --dry-run` starts faster
    from armorlab.vllm.servers import ServerSet

EXECUTORS = ("local", "slurm")
LAUNCHERS = ("python", "accelerate")
_SBATCH_KEY = re.compile(r"[a-z][a-z0-9_-]*")  # fullmatch: `$` would allow a final newline


def _int_at_least(lo: int, *, optional: bool = False) -> Callable[[Any], int | None]:
    check = integer(lo)
    return checks.optional(check) if optional else check


def _mem(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        raise Invalid("must be a positive finite number of GB or null")
    return v


def _lines(v: Any) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise Invalid("must be a list of shell lines")
    return [script_value(x) for x in v]  # one item = one line: a newline would hide a second one


def _script_text(v: Any) -> str:
    return script_value(text(v))


def _sbatch(v: Any) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise Invalid("must map sbatch option names to values")
    for key, value in v.items():
        if not isinstance(key, str) or not _SBATCH_KEY.fullmatch(key):
            raise Invalid(f"option name {key!r} must look like an sbatch long option (e.g. constraint)")
        if not isinstance(value, (str, int, float, bool)):
            raise Invalid(f"option {key!r} needs a scalar value")
        try:
            script_value(value)
        except Invalid as exc:
            raise Invalid(f"option {key!r} {exc}") from None
        name = key.replace("_", "-")
        if len(name) > len("export") and "export-file".startswith(name):  # sbatch takes any unambiguous prefix
            raise Invalid(f"option {key!r} is sbatch's --export-file (sbatch accepts a long option's unambiguous "
                          "prefixes), refused: the variables it sets cannot be checked; use export: ALL,NAME=value")
    return dict(v)


_EXPORT_NAME = re.compile(r"(?:^|,)\s*['\"]?([A-Za-z_][A-Za-z0-9_%]*)")


def _export(value: Any, allowed: tuple[str, ...]) -> None:
    """sbatch's ``--export=ALL,NAME=value,...`` may not set a start-up hook (checks.STARTUP_HOOKS:
    bash would run the file ``BASH_ENV`` names before the job script, on the node), nor a variable
    that chooses the code the job runs (checks.CODE_CHOOSING, LD_*), unless ``allow_exports`` names it."""
    for name in _EXPORT_NAME.findall(str(value)):
        if name in allowed:
            continue
        if checks.startup_hook(name):
            raise Invalid(f"option 'export' sets {name}, which makes the job's shell run code before the job "
                          f"starts; refused (start-up hooks: {', '.join(checks.STARTUP_HOOKS)}, BASH_FUNC_*) "
                          "unless the profile's allow_exports names it")
        if checks.runs_code(name):
            raise Invalid(f"option 'export' sets {name}, which chooses the code the job runs; refused unless "
                          f"the profile's allow_exports names it (allow_exports: [{name}]), or set it in setup:")


def _names(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", x)
                                          for x in v):
        raise Invalid("must be a list of environment variable names")
    return tuple(v)


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "executor": choice(*EXECUTORS),
    "workers": _int_at_least(1),
    "partition": checks.optional(_script_text),
    "account": checks.optional(_script_text),
    "qos": checks.optional(_script_text),
    "nodes": _int_at_least(1),
    "gpus_per_node": _int_at_least(0),
    "gpu_memory_gb": _mem,
    "cpus_per_task": _int_at_least(1, optional=True),
    "mem_gb": _mem,
    "time_min": _int_at_least(1),
    "array_parallelism": _int_at_least(1),
    "signal_delay_s": _int_at_least(1),
    "max_num_timeout": _int_at_least(0),
    "max_array_size": _int_at_least(1, optional=True),
    "setup": _lines,
    "launcher": choice(*LAUNCHERS),
    "accelerate_config": checks.optional(_script_text),
    "python": checks.optional(_script_text),
    "sbatch": _sbatch,
    "allow_exports": _names,
    "vllm_servers": lambda v: v,  # checked in parse_profile, against gpus_per_node and the launcher
}


@dataclass(frozen=True)
class Profile:
    executor: str = "local"
    workers: int = 1
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int = 1
    gpus_per_node: int = 0
    gpu_memory_gb: float | None = None  # None: no GPU or not stated (the memory plan only prints)
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    time_min: int = 60
    array_parallelism: int = 64
    signal_delay_s: int = 120
    max_num_timeout: int = 3
    max_array_size: int | None = None
    setup: list[str] = field(default_factory=list)
    launcher: str = "python"
    accelerate_config: str | None = None
    python: str | None = None
    sbatch: dict[str, Any] = field(default_factory=dict)
    allow_exports: tuple[str, ...] = ()
    vllm_servers: ServerSet | None = None
    path: Path | None = None

    def submitit_parameters(self, *, job_name: str = "armorlab") -> dict[str, Any]:
        """Keyword arguments for ``submitit.SlurmExecutor.update_parameters`` (Slurm's own names)."""
        params: dict[str, Any] = {
            "job_name": job_name,
            "nodes": self.nodes,
            "time": self.time_min,
            "array_parallelism": self.array_parallelism,
            "signal_delay_s": self.signal_delay_s,
            # one task per node: the job process launches the trainer (or accelerate) itself
            "ntasks_per_node": 1,
            "stderr_to_stdout": False,
        }
        for key in ("partition", "account", "qos", "cpus_per_task"):
            if getattr(self, key) is not None:
                params[key] = getattr(self, key)
        if self.gpus_per_node:
            params["gpus_per_node"] = self.gpus_per_node
        if self.mem_gb is not None:
            params["mem"] = f"{int(self.mem_gb)}GB" if float(self.mem_gb).is_integer() \
                else f"{int(self.mem_gb * 1024)}MB"
        if self.setup:
            params["setup"] = list(self.setup)
        if self.sbatch:
            params["additional_parameters"] = copy.deepcopy(self.sbatch)
        return params

    def launch_options(self) -> dict[str, Any]:
        """What a TrainJob needs to know from the profile."""
        out: dict[str, Any] = {"launcher": self.launcher, "accelerate_config": self.accelerate_config}
        if self.vllm_servers is not None:
            out["vllm_servers"] = self.vllm_servers
        return out

    def refuse_vllm_servers(self, command: str) -> None:
        """For commands that do not start a profile's vLLM servers (armorlab tune)."""
        if self.vllm_servers is not None:
            raise ArmorLabError(f"{command} does not start vLLM servers: use a profile without vllm_servers "
                                "(colocated engines need none)", key="vllm_servers", value=list(self.vllm_servers.roles()),
                                file=str(self.path) if self.path else None)


def parse_profile(data: Mapping[str, Any], *, path: Path | None = None) -> Profile:
    file = str(path) if path is not None else "<profile>"
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key not in _CHECKS:
            raise ArmorLabError(f"unknown profile key{checks.did_you_mean(key, _CHECKS)} (known: {', '.join(_CHECKS)})",
                                key=str(key),
                                value=raw, file=file)
        try:
            values[key] = _CHECKS[key](raw)
        except Invalid as exc:
            raise ArmorLabError(str(exc), key=key, value=raw, file=file) from None
    for key, value in values.get("sbatch", {}).items():
        if key == "export":
            try:
                _export(value, values.get("allow_exports", ()))
            except Invalid as exc:
                raise ArmorLabError(str(exc), key="sbatch", value=data["sbatch"], file=file) from None
    if values.get("launcher") == "accelerate":
        cfg = values.get("accelerate_config")
        if cfg is None:
            raise ArmorLabError("launcher: accelerate needs an accelerate config file",
                                key="accelerate_config", value=None, file=file)
        if path is not None and not Path(cfg).expanduser().is_absolute():
            cfg = str((path.parent / cfg).resolve()) if (path.parent / cfg).is_file() else cfg
        values["accelerate_config"] = cfg
    if "vllm_servers" in values:
        from armorlab.vllm.servers import parse_servers  # lazy: only a profile with servers pays for it

        values["vllm_servers"] = parse_servers(values["vllm_servers"], gpus_per_node=values.get("gpus_per_node", 0),
                                               launcher=values.get("launcher", "python"),
                                               accelerate_config=values.get("accelerate_config"), file=file,
                                               nodes=values.get("nodes", 1))
    return Profile(**values, path=path)


def load_profile(path: str | Path | None) -> Profile:
    """A profile file, or the embedded defaults (local executor, one worker) when None."""
    if path is None:
        return Profile()
    path = Path(path)
    return parse_profile(load_yaml_mapping(path), path=path)


PROFILE_FIELDS = tuple(f.name for f in fields(Profile) if f.name != "path")
