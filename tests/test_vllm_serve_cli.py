"""`armorlab vllm-serve`: the command it runs (TRL's, adapted to the machine) and its CLI. No vLLM needed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


def test_serve_command_on_cpu_is_trls_with_cpu_defaults_and_the_api_server_entry():
    from armorlab.vllm.serve import serve_command

    argv, env = serve_command("/models/m", host="127.0.0.1", port=8123, extra=["--max-model-len", "256"],
                              cuda=False, vllm_cli=False, environ={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert argv[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m"]
    assert "serve" not in argv
    at = argv.index("--port")
    assert argv[at + 1] == "8123" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"  # TRL's IS correction needs it
    assert argv[-2:] == ["--max-model-len", "256"]  # the user's flags last: they win
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and env["VLLM_HOST_IP"] == "127.0.0.1"  # set ones are kept


def test_serve_command_on_gpu_is_trls_own():
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    from armorlab.vllm.serve import serve_command

    argv, env = serve_command("/models/m", host="0.0.0.0", port=8000, cuda=True, vllm_cli=True, environ={})
    assert argv == build_command(ScriptArguments(model="/models/m", host="0.0.0.0", port=8000), [])
    assert env == {"VLLM_SERVER_DEV_MODE": "1"}


def test_serve_command_on_gpu_on_loopback_sets_the_loopback_host_ip_as_on_cpu():
    """The job's servers listen on 127.0.0.1 beside the trainer: vLLM's rendezvous and the NCCL
    weight-sync group must meet there too (VLLM_HOST_IP), on CUDA as on CPU; a set value is kept."""
    from armorlab.vllm.serve import serve_command

    _, env = serve_command("/models/m", host="127.0.0.1", port=8000, cuda=True, vllm_cli=True, environ={})
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_HOST_IP": "127.0.0.1"}  # no CPU KV-cache setting
    _, env = serve_command("/models/m", host="localhost", port=8000, cuda=True, vllm_cli=True,
                           environ={"VLLM_HOST_IP": "10.0.0.7"})
    assert env["VLLM_HOST_IP"] == "10.0.0.7"


def test_cli_passes_options_and_the_args_after_the_double_dash(monkeypatch):
    import armorlab.vllm.serve as vs
    from armorlab.cli import main

    seen = {}
    monkeypatch.setattr(vs, "serve", lambda model, **kw: seen.update(model=model, **kw))
    with pytest.raises(SystemExit) as exit_:
        main(["vllm-serve", "--model", "/m", "--port", "8124", "--host", "127.0.0.1", "--",
              "--max-model-len", "64", "--enforce-eager"])
    assert exit_.value.code == 0
    assert seen == {"model": "/m", "host": "127.0.0.1", "port": 8124, "dtype": "auto",
                    "extra": ["--max-model-len", "64", "--enforce-eager"]}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_serve_without_vllm_is_a_one_line_error():
    out = subprocess.run([sys.executable, "-m", "armorlab", "vllm-serve", "--model", "/m", "--port", "8125"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "vLLM is not installed" in out.stderr and "vllm-serve" in out.stderr


@pytest.mark.parametrize("option, value, words", [
    ("port", 70000, "from 1 to 65535"), ("port", 0, "from 1 to 65535"), ("host", "", "host name"),
    ("host", "a b", "without spaces"), ("dtype", "fp8-ish", "one of auto"), ("model", "", "model directory"),
    ("model", "/no/such/model", "not a model directory"), ("model", "q\x07w", "control characters"),
    ("extra", ["--served-model-name", "a\x00b"], "NUL"),
])
def test_a_bad_server_value_is_named_beside_the_install_hint(monkeypatch, option, value, words):
    import armorlab.vllm.env as vllm_env
    from armorlab.errors import ArmorLabError
    from armorlab.vllm.serve import serve

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(vllm_env.importlib.util, "find_spec", lambda name, *a: None if name == "vllm"
                        else real_find_spec(name, *a))  # vLLM absent, whatever this machine has
    kwargs = {"model": "Qwen/Qwen3-0.6B", "host": "127.0.0.1", "port": 8000, "dtype": "auto", option: value}
    with pytest.raises(ArmorLabError) as info:
        serve(**kwargs)
    own, hint = info.value.problems
    assert own.key == ("vLLM arguments" if option == "extra" else f"--{option}") and words in str(own)
    assert own.value == (value[1] if option == "extra" else value)
    assert "vLLM is not installed" in str(hint) and words in str(info.value)
