"""Issue 9 §2: a reference reset under FSDP copies the FULL weights (run by tests/test_fsdp.py as
``accelerate launch --config_file FSDP2.yaml THIS_FILE OUT``: 2 CPU processes, gloo).

ARMOR with a reset after every step; a probe after armorlab's own callback gathers the policy
and π_ref whole on every process and records whether they are equal, and whether π_ref's
parameters really are shards (DTensors holding part of each tensor).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from transformers import TrainerCallback

from armorlab.reference import full_state_dict
from tests.trainer_support import build, resolved

CONFIG = {"objective": "armor", "max_steps": 2, "ref_reset_steps": 1, "save_steps": 2, "seed": 0,
          "per_device_train_batch_size": 8, "num_generations": 4, "steps_per_generation": 1,
          "task": {"name": "arithmetic", "train_size": 8}}


class FullWeightsProbe(TrainerCallback):
    def __init__(self, trainer):
        self.trainer, self.steps = trainer, {}

    def on_step_end(self, args, state, control, **kwargs):
        tr = self.trainer
        policy, ref = full_state_dict(tr.model_wrapped), full_state_dict(tr.ref_model)
        local = [p for p in tr.ref_model.parameters() if hasattr(p, "to_local")]
        self.steps[state.global_step] = {
            "equal": sorted(policy) == sorted(ref) and all(torch.equal(policy[k], ref[k]) for k in policy),
            "sharded_params": len(local),
            "shard_smaller": any(p.to_local().numel() < p.numel() for p in local),
            "norm": float(sum(v.double().norm() ** 2 for v in ref.values()) ** 0.5),
        }


def main(out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    trainer = build(Path(out), resolved(**CONFIG))
    probe = FullWeightsProbe(trainer)
    trainer.add_callback(probe)
    trainer.train()
    Path(out, f"probe-r{dist.get_rank()}.json").write_text(json.dumps(
        {"steps": probe.steps, "distributed_type": str(trainer.accelerator.distributed_type),
         "output_dir": trainer.args.output_dir}))


if __name__ == "__main__":
    main(sys.argv[1])
