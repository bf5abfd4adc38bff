"""FSDP (accelerate ``distributed_type: FSDP``, version 2) on 2 CPU processes: a reference reset
copies the full weights, and the checkpointed π_ref is the whole model (tests/fsdp_support.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.trainer_support import model_cache

HERE = Path(__file__).resolve().parent
FSDP2_CPU = {
    "compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "num_machines": 1, "num_processes": 2,
    "machine_rank": 0, "main_process_port": 0, "mixed_precision": "no", "use_cpu": False,
    "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                    "fsdp_reshard_after_forward": True, "fsdp_state_dict_type": "FULL_STATE_DICT"},
}


def test_reference_reset_under_fsdp_copies_full_weights(tmp_path):
    from safetensors.torch import load_file

    # build the cached tiny model here, not in two processes at once
    from tests.trainer_support import resolved, tokenizer_for

    tokenizer_for(resolved())
    config = tmp_path / "fsdp2.yaml"
    config.write_text(yaml.safe_dump(FSDP2_CPU))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "ARMORLAB_CACHE": model_cache()}
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                           str(HERE / "fsdp_support.py"), str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probes = [json.loads((tmp_path / f"probe-r{r}.json").read_text()) for r in (0, 1)]
    for p in probes:
        assert p["distributed_type"].endswith("FSDP")
        for step in ("1", "2"):
            s = p["steps"][step]
            assert s["sharded_params"] > 0 and s["shard_smaller"]  # π_ref really is sharded
            assert s["equal"]  # ... and holds the policy's full weights after the reset
    assert probes[0]["steps"]["1"]["norm"] != probes[0]["steps"]["2"]["norm"]  # the step moved them
    checkpoint = Path(probes[0]["output_dir"]) / "checkpoint-2"
    ref, policy = load_file(checkpoint / "reference.safetensors"), load_file(checkpoint / "model.safetensors")
    shared = sorted(set(ref) & set(policy))
    assert len(shared) >= len(policy) - 1  # every weight (a tied head may be stored once by transformers)
    for k in shared:
        assert ref[k].shape == policy[k].shape and bool((ref[k] == policy[k]).all()), k
