"""The numbers one look decides on: each run's endpoint score read exactly as the report reads it
(analysis.groups.run_scores) and whether the baseline fell (stats.margins F1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from armorlab.analysis import verdict_table
from armorlab.analysis.groups import Groups, Notes, run_scores
from armorlab.analysis.load import load
from armorlab.analysis.recipe import Recipe, Select
from armorlab.errors import ArmorLabError


@dataclass
class LookScores:
    per_run: pd.DataFrame           # one row per run: run_id, group (its arm), seed, state, every score
    value: dict[str, float]         # run id → the endpoint's value (NaN when the run has none)
    curve_alpha: float              # the collapse test's false-alarm rate per flat curve (F1's α_c)

    def values_by_arm(self, endpoint: str) -> dict[str, list[float]]:
        """{arm: finite values}: what armorlab.stats.sequential.decide_look takes."""
        return verdict_table.values_by_group(self.per_run, endpoint)

    def fall(self, arm: str) -> dict:
        """(F1) for ``arm`` as a baseline: how many of its runs collapsed, and whether it fell."""
        rows = np.flatnonzero(self.per_run["group"].to_numpy() == arm)
        return verdict_table.fall_record(self.per_run, rows, arm, self.curve_alpha)


def score_runs(run_dirs: Mapping[str, str | Path], arm_of: Mapping[str, str], endpoint: str, select: Select,
               *, matched_steps: Sequence[int] = (), cache: bool = True) -> LookScores:
    """Score ``run_dirs`` grouped by ``arm_of`` on every per-run score; ``endpoint`` must be one of them."""
    if not run_dirs:
        raise ArmorLabError("no runs to score", key="runs", value=[])
    rs = load([str(p) for p in run_dirs.values()], cache=cache)
    by_path = {Path(p).resolve(): rid for rid, p in run_dirs.items()}
    # the caller's run ids, whatever load named them; a run dir load found below one of ours is not one
    loaded_to_ours = {loaded: by_path[Path(path).resolve()]
                      for loaded, path in zip(rs.runs["run_id"].tolist(), rs.runs["path"].tolist(), strict=True)
                      if Path(path).resolve() in by_path}
    of_run = {loaded: arm_of[ours] for loaded, ours in loaded_to_ours.items()}
    recipe = Recipe(runs=[str(p) for p in run_dirs.values()], select=select)
    # run_scores reads only each run's group
    per_run = run_scores(rs, Groups([], pd.DataFrame(), of_run), recipe, list(matched_steps), Notes())
    per_run = per_run[per_run["run_id"].isin(list(of_run))].reset_index(drop=True)
    if endpoint not in per_run.columns:
        scores = [c for c in per_run.columns if per_run[c].dtype.kind == "f"]
        raise ArmorLabError(f"not a per-run score (scores: {', '.join(scores)})", key="compare.endpoint",
                            value=endpoint)
    per_run["run_id"] = per_run["run_id"].map(loaded_to_ours)
    column = pd.to_numeric(per_run[endpoint], errors="coerce").astype(float)
    value = dict.fromkeys(run_dirs, math.nan) | dict(zip(per_run["run_id"].tolist(), column.tolist(), strict=True))
    return LookScores(per_run, value, recipe.collapse.alpha)
