"""Old module paths of the flat layout (before 0.2), importable for one more release.

``import armorlab.trainer`` warns (DeprecationWarning naming the new path) and returns the new
module itself, ``armorlab.train.trainer``: the same object, so ``isinstance`` checks and pickles of
queued Slurm jobs that name an old path keep working. Removed in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str] = {
    "armorlab.config": "armorlab.core.config",
    "armorlab.checks": "armorlab.core.checks",
    "armorlab.runs": "armorlab.core.runs",
    "armorlab.fsutil": "armorlab.core.fsutil",
    "armorlab.identity": "armorlab.core.identity",
    "armorlab.health": "armorlab.core.health",
    "armorlab.trl_fields": "armorlab.core.trl_fields",
    "armorlab.vllm_config": "armorlab.core.vllm_config",
    "armorlab.objectives": "armorlab.algos.loss",  # policy_loss and the equations
    "armorlab.capacity": "armorlab.algos.capacity",
    "armorlab.advantages": "armorlab.algos.advantages",
    "armorlab.dynamic_sampling": "armorlab.algos.dynamic_sampling",
    "armorlab.trainer": "armorlab.train.trainer",
    "armorlab.trainer_hooks": "armorlab.train.hooks",
    "armorlab.trainer_config": "armorlab.train.trainer_config",
    "armorlab.anchors": "armorlab.train.anchors",
    "armorlab.reference": "armorlab.train.reference",
    "armorlab.evaluation": "armorlab.train.evaluation",
    "armorlab.telemetry": "armorlab.train.telemetry",
    "armorlab.launch": "armorlab.train.launch",
    "armorlab.models": "armorlab.train.models",
    "armorlab.vllm_reference": "armorlab.train.vllm_reference",
    "armorlab.vllm_client": "armorlab.train.vllm_client",
    "armorlab.vllm_serve": "armorlab.vllm.serve",
    "armorlab.vllm_endpoints": "armorlab.vllm.endpoints",
    "armorlab.sweeps.vllm_servers": "armorlab.vllm.servers",
    "armorlab.sweeps.server_checks": "armorlab.vllm.server_checks",
    "armorlab.analysis.kl": "armorlab.algos.kl",
    "armorlab.analysis.collapse": "armorlab.stats.collapse",
    "armorlab.analysis.select": "armorlab.stats.select",
    "armorlab.analysis.stats": "armorlab.stats.seeds",
    "armorlab.analysis.verdicts": "armorlab.stats.verdicts",
    "armorlab.analysis.sequential": "armorlab.stats.sequential",
    "armorlab.analysis.looks_text": "armorlab.stats.sequential_text",
    # issue 34: each look-alike module named by what it holds; seeds until resolved under one name
    "armorlab.sweeps.looks": "armorlab.sweeps.until_resolved_looks",
    "armorlab.sweeps.compare": "armorlab.sweeps.until_resolved_compare",
    "armorlab.analysis.looks_report": "armorlab.analysis.until_resolved_report",
    "armorlab.analysis.look_values": "armorlab.analysis.until_resolved_scores",
    "armorlab.analysis.values": "armorlab.analysis.value_labels",
    "armorlab.analysis.mechanisms": "armorlab.analysis.mechanism_table",
    "armorlab.train.mechanisms": "armorlab.train.mechanism_telemetry",
    "armorlab.core.fit": "armorlab.core.fit_checks",
    "armorlab.sweeps.fastcopy": "armorlab.sweeps.seed_copies",
}

_OWN_SPECS: dict[str, importlib.machinery.ModuleSpec] = {}


class _OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers for the old paths only; every other import goes on to Python's own finders."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes away in armorlab 0.3",
                      DeprecationWarning, stacklevel=_caller_level())
        module = importlib.import_module(new)
        _OWN_SPECS.setdefault(new, module.__spec__)
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system stamped the old path's spec on the module: give it back its own
        module.__spec__ = _OWN_SPECS[module.__name__]


def _caller_level() -> int:
    """``warnings.warn``'s stacklevel of the frame that wrote the import, seen from create_module:
    warnings itself skips importlib's bootstrap frames; importlib.import_module's is skipped here."""
    frame, level = sys._getframe(2), 1  # level 1 is create_module, the caller of this function
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):  # frames warnings counts
            level += 1
            if name != __file__ and not name.endswith(os.path.join("importlib", "__init__.py")):
                return level
        frame = frame.f_back
    return level


def install() -> None:
    if not any(isinstance(f, _OldPathFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPathFinder())
