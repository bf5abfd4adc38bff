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
    ({"objective": "dapo", "ref_vllm_mode": "colocate"}, "ref_vllm_mode"),
])
def test_bad_engine_settings_name_the_key(raw, key):
    with pytest.raises(ArmorLabError) as err:
        resolve(raw)
    assert err.value.key == key


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_missing_vllm_is_an_armorlab_error_naming_the_key():
    from armorlab.vllm.env import require_vllm

    with pytest.raises(ArmorLabError, match="pip install") as err:
        require_vllm("ref_vllm_mode", "colocate")
    assert err.value.key == "ref_vllm_mode"
