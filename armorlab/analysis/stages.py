"""The typed results of the report's stages (armorlab.analysis.report runs them): each frozen,
each with the notes its stage wrote, which the page lists once, in one order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from armorlab.analysis import groups as G
from armorlab.analysis.load import RunSet
from armorlab.analysis.verdict_table import VerdictTable
from armorlab.stats.seeds import CurveBand


@dataclass(frozen=True)
class Loaded:
    runs: RunSet
    curves: list[str]        # the curves to draw and check, the selection metric first
    notes: tuple[str, ...]   # the runs' own warnings, unfinished runs, missing metrics


@dataclass(frozen=True)
class Grouped:
    groups: G.Groups
    keys: list[str]
    display: dict[str, str]        # label → the group's name in figures, page and sentences
    diff: pd.DataFrame             # config keys that differ between groups
    pairs: list[tuple[str, str]]   # the compared (X, Y) labels
    notes: tuple[str, ...]
    compared: str = ""             # how the pairs were chosen (groups.comparison_pairs), groups by name

    def named(self, by_label: Mapping[str, Any]) -> dict[str, Any]:
        return {self.display[g]: v for g, v in by_label.items()}


@dataclass(frozen=True)
class Scored:
    bands: dict[str, dict[str, CurveBand]]   # metric → group name → band (non-empty only)
    noise: dict[str, tuple[np.ndarray, np.ndarray]]  # group name → eval noise of the selection metric
    matched: list[int]
    per_run: pd.DataFrame
    cols: list[str]                 # score columns
    tok_cols: list[str]             # token-sample columns
    summary: pd.DataFrame           # one row per group
    scores: list[str]               # the headline scores
    capacity: dict[str, np.ndarray]     # group name → own-objective capacities of A>0 tokens
    counterfactual: dict[str, np.ndarray]  # objective → capacities of the same tokens
    curve_notes: tuple[str, ...]    # curves interpolated across seeds
    notes: tuple[str, ...]          # tokens and per-run scores


@dataclass(frozen=True)
class Decided:
    verdicts: VerdictTable | None   # None for a sweep run until resolved:
    sequential: list                               # its looks.json's verdicts instead
    poi: pd.DataFrame
    notes: tuple[str, ...]

    @property
    def sentences(self) -> list[str]:
        return self.verdicts.sentences if self.verdicts is not None else [
            x for s in self.sequential for x in s.sentences]


@dataclass(frozen=True)
class Drawn:
    figures: tuple[tuple[str, Path, str], ...]   # (section, path, caption) in page order
