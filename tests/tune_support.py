"""What the study tests share: the stand-in trainer (armorlab.tune.synthetic_trainer: the run-dir
contract with a closed-form val curve of known optimum) and study specs written from a search block."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

STANDIN = [sys.executable, "-m", "armorlab.tune.synthetic_trainer"]
# quality 1 at the optimum; learning_rate is left at 1e-4 (its optimum) unless searched
BASE = "{objective: armor, max_steps: 30, val_every: 5, learning_rate: 1.0e-4, epsilon_high: 0.3}"


def standin_env(step_s: float = 0.01) -> dict[str, str]:
    """The environment that makes `armorlab train` (and so every trial) run the stand-in."""
    return {"ARMORLAB_TRAIN_COMMAND": json.dumps(STANDIN), "ARMORLAB_SYNTHETIC_STEP_S": str(step_s)}


@pytest.fixture
def standin(monkeypatch):
    for key, value in standin_env().items():
        monkeypatch.setenv(key, value)


def spec(tmp_path: Path, name: str, search: str, base: str = BASE, seeds: str = "[0]") -> Path:
    """A study spec file `name.yaml` in tmp_path; `search` is the (dedented) YAML of its search block."""
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"name: {name}\nbase: {base}\nseeds: {seeds}\nsearch:\n"
                 + textwrap.indent(textwrap.dedent(search), "  "))
    return p
