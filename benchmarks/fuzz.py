"""Fuzz benchmark (issue 13 §4): ≥ 10,000 generated inputs through the CLI, counting tracebacks.

Same strategies as tests/test_fuzz.py (tests/fuzz_cases.py): configs and sweep specs (+ profiles)
through ``armorlab sweep --dry-run``, damaged run dirs through ``armorlab status``, and fewer of the
slow ones (recipes and damaged run dirs through ``armorlab report``, which draws plots). Every case
must end in exit 0 or exit 2. Prints ``name=value`` lines; the last is the traceback count (goal 0).

    python benchmarks/fuzz.py [--cases 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from fuzz_cases import (  # noqa: E402
    Tally,
    Workspace,
    case_recipe,
    case_run_dir,
    case_spec,
    config_dicts,
    mutations,
    profile_dicts,
    recipe_dicts,
    run_cli,
    run_damage,
    spec_dicts,
)
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# share of the cases per kind (report cases draw figures: ~1 s each, so few of them)
MIX = {"config": 0.36, "spec": 0.36, "status": 0.25, "recipe": 0.015, "report": 0.015}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the CLI's warnings about damaged files are expected here
    ws, tally = Workspace(), Tally()
    t0 = time.perf_counter()

    def budget(kind: str) -> settings:
        return settings(max_examples=max(1, round(args.cases * MIX[kind])), deadline=None, database=None,
                        suppress_health_check=list(HealthCheck), derandomize=False)

    def check(kind, argv_case):
        rc, _ = run_cli(argv_case[0])
        tally.add(kind, rc, argv_case[1])

    @budget("config")
    @given(cfg=config_dicts, mutation=mutations)
    def configs(cfg, mutation):
        check("config", case_spec(ws, {"name": "fz", "base": cfg}, mutation, None))

    @budget("spec")
    @given(spec=spec_dicts, mutation=mutations, profile=st.one_of(st.none(), profile_dicts))
    def specs(spec, mutation, profile):
        check("spec", case_spec(ws, spec, mutation, profile))

    @budget("status")
    @given(damage=run_damage)
    def status(damage):
        check("status", case_run_dir(ws, damage, "status"))

    @budget("recipe")
    @given(recipe=recipe_dicts, mutation=mutations)
    def recipes(recipe, mutation):
        check("recipe", case_recipe(ws, recipe, mutation))

    @budget("report")
    @given(damage=run_damage)
    def reports(damage):
        check("report", case_run_dir(ws, damage, "report"))

    try:
        for fn in (configs, specs, status, recipes, reports):
            seed(args.seed)(fn)()  # the same --seed generates the same cases
    finally:
        ws.close()
    for tb in tally.tracebacks:
        print(tb, file=sys.stderr)
    for kind in MIX:
        by = {rc: n for (k, rc), n in tally.counts.items() if k == kind}
        print(f"{kind}_cases={sum(by.values())} {kind}_exit0={by.get(0, 0)} {kind}_exit2={by.get(2, 0)} "
              f"{kind}_tracebacks={by.get('traceback', 0)}")
    print(f"seconds={time.perf_counter() - t0:.0f}")
    print(f"cases={tally.n}")
    print(f"tracebacks={tally.n_tracebacks}")
    return 0 if tally.n_tracebacks == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
