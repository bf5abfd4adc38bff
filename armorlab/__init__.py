"""armorlab: ablations for ARMOR and UP policy objectives in LLM RL with verifiable rewards.

The public API is exported lazily, so ``import armorlab`` (and ``from armorlab import resolve``)
does not import torch; ``ArmorLabTrainer`` and the loss functions import it when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from armorlab import _moved
from armorlab._version import __version__ as __version__

# public name → module that defines it
_EXPORTS = {
    "ArmorLabTrainer": "armorlab.train.trainer",
    "ArmorLabConfig": "armorlab.train.trainer_config",
    "ArmorLabError": "armorlab.errors",
    "resolve": "armorlab.core.config",
    "load_config": "armorlab.core.config",
    "RunDir": "armorlab.core.runs",
    "register_objective": "armorlab.algos.objectives",
    "objective_spec": "armorlab.algos.objectives",
    "policy_loss": "armorlab.algos.loss",
    "probability_capacity": "armorlab.algos.loss",
    "load": "armorlab.analysis.load",
}
__all__ = ["ArmorLabConfig", "ArmorLabError", "ArmorLabTrainer", "RunDir", "load", "load_config",
           "objective_spec", "policy_loss", "probability_capacity", "register_objective", "resolve"]
assert sorted(__all__) == sorted(_EXPORTS)

_moved.install()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'armorlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # for type checkers and IDEs; never executed
    from armorlab.algos.loss import policy_loss, probability_capacity
    from armorlab.algos.objectives import objective_spec, register_objective
    from armorlab.analysis.load import load
    from armorlab.core.config import load_config, resolve
    from armorlab.core.runs import RunDir
    from armorlab.errors import ArmorLabError
    from armorlab.train.trainer import ArmorLabTrainer
    from armorlab.train.trainer_config import ArmorLabConfig
