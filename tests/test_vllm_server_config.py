"""vLLM server settings (policy: TRL's vllm_server_*, reference: ref_vllm_server_*): resolution, run ids,
errors naming key/value/file. No vLLM needed."""

from __future__ import annotations

import pytest

from armorlab.core.config import resolve
from armorlab.core.runs import run_id
from armorlab.errors import ArmorLabError

ARMOR = {"objective": "armor"}
POLICY_SERVER = {"use_vllm": True, "vllm_mode": "server"}


def test_policy_server_fields_are_honoured_with_server_mode_and_defaults_keep_run_ids():
    cfg = resolve({**ARMOR, **POLICY_SERVER, "vllm_server_host": "127.0.0.1", "vllm_server_port": 8100})
    assert (cfg["vllm_mode"], cfg["vllm_server_host"], cfg["vllm_server_port"]) == ("server", "127.0.0.1", 8100)
    assert resolve(cfg) == cfg
    # TRL's defaults written out are the same run as absent ones (as before the server mode was honoured)
    plain = resolve({**ARMOR, "use_vllm": True})
    spelled = resolve({**ARMOR, "use_vllm": True, "vllm_mode": "colocate", "vllm_server_port": 8000,
                       "vllm_server_host": "0.0.0.0", "vllm_group_port": 51216})
    assert spelled == plain and run_id(spelled) == run_id(plain) and "vllm_mode" not in plain


@pytest.mark.parametrize(("raw", "key"), [
    ({"vllm_server_port": 8100}, "vllm_server_port"),                           # no server mode: TRL would ignore it
    ({"use_vllm": True, "vllm_server_host": "10.0.0.2"}, "vllm_server_host"),   # colocate ignores it
    ({"vllm_mode": "server"}, "vllm_mode"),                                     # use_vllm off
])
def test_policy_server_fields_that_would_be_ignored_are_errors(raw, key):
    with pytest.raises(ArmorLabError) as err:
        resolve({**ARMOR, **raw}, file="run.yaml")
    assert err.value.key == key and "run.yaml" in str(err.value) and "use_vllm: true" in str(err.value)


def test_reference_server_keeps_its_own_keys_only():
    cfg = resolve({**ARMOR, "ref_vllm_mode": "server", "ref_vllm_server_host": "127.0.0.1",
                   "ref_vllm_server_port": 8200, "ref_vllm_memory": 0.5})
    assert (cfg["ref_vllm_server_host"], cfg["ref_vllm_server_port"], cfg["ref_vllm_group_port"]) == \
        ("127.0.0.1", 8200, 51217)
    assert "ref_vllm_memory" not in cfg  # a colocated engine's share: not read by a server
    assert resolve(cfg) == cfg
    colocate = resolve({**ARMOR, "ref_vllm_mode": "colocate", "ref_vllm_server_port": 8200})
    assert not any(k.startswith("ref_vllm_server") for k in colocate)
    assert colocate == resolve({**ARMOR, "ref_vllm_mode": "colocate"})  # colocate run ids as before


@pytest.mark.parametrize(("raw", "key"), [
    ({"ref_vllm_server_port": 0}, "ref_vllm_server_port"),
    ({"ref_vllm_server_port": 70000}, "ref_vllm_server_port"),
    ({"ref_vllm_server_port": "8001"}, "ref_vllm_server_port"),
    ({"ref_vllm_server_host": ""}, "ref_vllm_server_host"),
    ({"ref_vllm_server_host": "node1\n"}, "ref_vllm_server_host"),        # a pasted newline
    ({"ref_vllm_server_host": "node 1"}, "ref_vllm_server_host"),
    ({"ref_vllm_server_host": "n\x00"}, "ref_vllm_server_host"),
    ({"ref_vllm_server_host": 10}, "ref_vllm_server_host"),               # a YAML number, not a host
    ({"ref_vllm_server_base_url": ["http://n1:9000"]}, "ref_vllm_server_base_url"),
    ({"ref_vllm_server_base_url": "http://n1:9000/\tx"}, "ref_vllm_server_base_url"),
    ({"ref_vllm_server_timeout": -1}, "ref_vllm_server_timeout"),
    ({"ref_vllm_group_port": 1.5}, "ref_vllm_group_port"),
    # one server for both: every policy sync would overwrite π_ref
    ({**POLICY_SERVER, "vllm_server_port": 8001, "vllm_server_host": "127.0.0.1",
      "ref_vllm_server_host": "127.0.0.1"}, "ref_vllm_server_port"),
    ({**POLICY_SERVER, "vllm_server_base_url": "http://n1:9000/", "ref_vllm_server_base_url": "http://n1:9000"},
     "ref_vllm_server_base_url"),
    # both NCCL groups on one port
    ({**POLICY_SERVER, "ref_vllm_group_port": 51216}, "ref_vllm_group_port"),
])
def test_bad_reference_server_settings_name_key_value_and_file(raw, key):
    with pytest.raises(ArmorLabError) as err:
        resolve({**ARMOR, "ref_vllm_mode": "server", **raw}, file="run.yaml")
    assert err.value.key == key and "run.yaml" in str(err.value)
    assert key not in raw or repr(raw[key]) in str(err.value)


def test_two_servers_on_distinct_addresses_and_ports_resolve():
    cfg = resolve({**ARMOR, **POLICY_SERVER, "vllm_server_host": "127.0.0.1", "vllm_server_port": 8100,
                   "ref_vllm_mode": "server", "ref_vllm_server_host": "127.0.0.1", "ref_vllm_server_port": 8001})
    assert (cfg["vllm_server_port"], cfg["ref_vllm_server_port"]) == (8100, 8001)


def test_the_trainer_config_refuses_the_same_combinations():
    from armorlab.train.trainer import ArmorLabConfig

    base = {"output_dir": "/tmp/unused-armorlab", "use_cpu": True, "bf16": False, "report_to": [],
            "per_device_train_batch_size": 4, "num_generations": 2, "anchor": True}
    ArmorLabConfig(**base, use_vllm=True, vllm_mode="server", ref_vllm_mode="server")  # 8000 and 8001
    for extra, key in (({"vllm_server_port": 8100}, "vllm_server_port"),
                       ({"use_vllm": True, "vllm_mode": "server", "ref_vllm_mode": "server",
                         "ref_vllm_server_port": 8000}, "ref_vllm_server_port")):
        with pytest.raises(ArmorLabError) as err:
            ArmorLabConfig(**base, **extra)
        assert err.value.key == key
