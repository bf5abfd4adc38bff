"""The malformed-input campaign (issues 13 §4 and 30): generated inputs through the CLI, and the named
cases over every surface added since, counting tracebacks, hangs and executed payloads (goal: 0 of each).

Part 1, generated (tests/fuzz_cases.py, hypothesis): ``--cases`` configs, sweep specs (+ profiles
with vllm_servers and sbatch exports) through ``armorlab sweep --dry-run``, damaged run dirs
(owner.lock included) through ``armorlab status``, and fewer of the slow ones (recipes and damaged
run dirs through ``armorlab report``). Run in-process: a case past 20 s is a hang (SIGALRM); a
``$(touch PWNED)`` that ran is a payload.

Part 2, named (tests/fuzz_surfaces.py): each case in a child process with a timeout, so a hang or a
crash (pyarrow's segfault) is measured, not suffered; it also counts inputs accepted although
invalid, valid ones refused, errors that do not name what they must, and wrong results.

Part 1 also imports generated rows (any step, any value, a raw tail) as a verl log or a trackio project
in-process: a step on the curve that no row gave as a whole number in [0, 2**63) is a wrong result,
counted under ``accepted_invalid``.

Part 1 also generates storage URLs with a password in each form one can hold it (userinfo, a user
holding '@', ``?password=`` in any case, ``?sslpassword=``, libpq ``key=value`` strings) and counts
those whose password is shown (redacted, scrubbed from an error, or in the URL stored).

Prints ``name=value`` lines, per kind and surface, then per surface the issue-41 tally
(``writes_outside secrets segfaults hangs tracebacks accepted_invalid``), then the totals. The armorlab measured is the one
on PYTHONPATH (and, for part 2, ``--tree``, default: the same checkout): the "before" figure is

    PYTHONPATH=/path/to/main python benchmarks/fuzz.py --tree /path/to/main

    python benchmarks/fuzz.py [--cases 10000] [--seed 0] [--quick] [--surface security ...] [--no-generated]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# share of the generated cases per kind (report cases draw figures: ~1 s each, so few of them);
# storage URLs are checked in-process (microseconds each): as many as there are other cases
MIX = {"config": 0.36, "spec": 0.36, "status": 0.25, "recipe": 0.015, "report": 0.015, "importer": 0.1}
URL_SHARE = 1.0
# the issue-41 tally: its name → the named cases' outcomes it counts
HARM = {"writes_outside": ("writes_outside",), "secrets": ("secrets",), "segfaults": ("segfault",),
        "hangs": ("hang",), "tracebacks": ("traceback",), "accepted_invalid": ("accepted",),
        "payloads": ("payload",)}


def generated(n_cases: int, seed_value: int) -> tuple[dict[str, int], list[str]]:
    from fuzz_cases import (
        STORAGE_FORMS,
        Tally,
        Workspace,
        case_importer,
        case_recipe,
        case_run_dir,
        case_spec,
        config_dicts,
        importer_kinds,
        importer_rows,
        mutations,
        profile_dicts,
        recipe_dicts,
        run_cli,
        run_damage,
        spec_dicts,
        storage_passwords,
        storage_secret_shown,
    )
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    ws, tally = Workspace(), Tally()

    def budget(kind: str) -> settings:
        return settings(max_examples=max(1, round(n_cases * MIX[kind])), deadline=None, database=None,
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

    @budget("importer")
    @given(kind=importer_kinds, rows=importer_rows, tail=st.binary(max_size=80))
    def imports(kind, rows, tail):
        tally.add("importer", *case_importer(ws, kind, rows, tail))

    leaks: list[str] = []

    @settings(max_examples=max(1, round(n_cases * URL_SHARE)), deadline=None, database=None,
              suppress_health_check=list(HealthCheck), derandomize=False)
    @given(form=st.sampled_from(STORAGE_FORMS), password=storage_passwords)
    def urls(form, password):
        shown = storage_secret_shown(form, password)
        tally.counts[("url", "secret" if shown else 0)] += 1
        if shown and len(leaks) < 20:
            leaks.append(f"[url] {form} {password!r}: {shown}")

    cwd = os.getcwd()
    os.chdir(ws.root)  # where a `$(touch PWNED)` that ran would leave its file
    try:
        for fn in (configs, specs, status, recipes, reports, imports, urls):
            seed(seed_value)(fn)()  # the same --seed generates the same cases
    finally:
        os.chdir(cwd)
        ws.close()
    lines = []
    for kind in MIX:
        by = {rc: n for (k, rc), n in tally.counts.items() if k == kind}
        lines.append(f"{kind}_cases={sum(by.values())} {kind}_exit0={by.get(0, 0)} {kind}_exit2={by.get(2, 0)} "
                     f"{kind}_tracebacks={by.get('traceback', 0)} {kind}_hangs={by.get('hang', 0)} "
                     f"{kind}_payloads={by.get('payload', 0)}" + (f" {kind}_wrong={by.get('wrong', 0)}"
                                                                   if kind == "importer" else ""))
    n_urls = sum(n for (k, _), n in tally.counts.items() if k == "url")
    lines.append(f"url_cases={n_urls} url_secrets={tally.counts[('url', 'secret')]}")
    for tb in [*tally.tracebacks, *leaks]:
        print(tb, file=sys.stderr)
    totals = {"cases": tally.n, "tracebacks": tally.n_tracebacks, "hangs": tally.total("hang"),
              "payloads": tally.total("payload"), "secrets": tally.counts[("url", "secret")],
              "wrong": tally.total("wrong")}
    return totals, lines


def named(tree: str, quick: bool, surfaces: list[str] | None, show: bool) -> tuple[dict[str, int], list[str]]:
    from fuzz_surfaces import BAD, CASES, SURFACES, Workspace, available, run_case

    ws = Workspace(tree=tree)
    counts: Counter = Counter()
    skipped = 0
    have: dict[str | None, bool] = {}
    try:
        for case in CASES:
            if (surfaces and case.surface not in surfaces) or (quick and case.slow):
                continue
            if case.needs not in have:
                have[case.needs] = available(case.needs)
            if not have[case.needs]:
                skipped += 1
                continue
            result = run_case(ws, case)
            counts[(case.surface, result.outcome)] += 1
            if show or result.outcome in BAD:
                print(f"[{case.surface}] {case.name}: {result.outcome} (exit {result.rc}, {result.seconds:.1f}s)"
                      + (f"\n    {result.tail[-400:]!r}" if result.outcome in BAD else ""), file=sys.stderr)
    finally:
        ws.close()
    lines = []
    for surface in SURFACES:
        by = {o: n for (s, o), n in counts.items() if s == surface}
        if by:
            lines.append(f"{surface}_cases={sum(by.values())} " + " ".join(
                f"{surface}_{o}={by.get(o, 0)}" for o in ("ok", "error", *BAD)))
    for surface in SURFACES:
        by = {o: n for (s, o), n in counts.items() if s == surface}
        if by:
            lines.append(f"{surface}: " + " ".join(f"{h}={sum(by.get(o, 0) for o in outs)}" for h, outs in HARM.items()))
    total = {o: sum(n for (_, oo), n in counts.items() if oo == o) for o in ("ok", "error", *BAD)}
    total["cases"] = sum(counts.values())
    total["skipped"] = skipped
    return total, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=10_000, help="generated cases (part 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tree", default=None, help="checkout whose armorlab part 2 runs (default: the imported one)")
    ap.add_argument("--quick", action="store_true", help="part 2 without the cases that train or load models")
    ap.add_argument("--surface", action="append", help="part 2: only these surfaces")
    ap.add_argument("--no-generated", action="store_true", help="skip part 1")
    ap.add_argument("--no-named", action="store_true", help="skip part 2")
    ap.add_argument("--show", action="store_true", help="print every named case's outcome")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the CLI's warnings about damaged files are expected here
    import armorlab

    tree = args.tree or str(Path(armorlab.__file__).resolve().parents[1])
    print(f"armorlab={tree} load={os.getloadavg()[0]:.1f} tmp={tempfile.gettempdir()}")
    t0 = time.perf_counter()
    gen = {"cases": 0, "tracebacks": 0, "hangs": 0, "payloads": 0, "secrets": 0, "wrong": 0}
    if not args.no_generated:
        gen, lines = generated(args.cases, args.seed)
        print("\n".join(lines))
    from fuzz_surfaces import BAD

    nam = {"cases": 0, **{o: 0 for o in BAD}}
    if not args.no_named:
        nam, lines = named(tree, args.quick, args.surface, args.show)
        print("\n".join(lines))
        print("named_" + " named_".join(f"{k}={v}" for k, v in nam.items()))
    print(f"seconds={time.perf_counter() - t0:.0f}")
    print(f"cases={gen['cases'] + nam['cases']}")
    tracebacks = gen["tracebacks"] + nam["traceback"]
    hangs = gen["hangs"] + nam["hang"]
    payloads = gen["payloads"] + nam["payload"]
    harm = {"writes_outside": nam["writes_outside"], "secrets": gen["secrets"] + nam["secrets"],
            "segfaults": nam["segfault"], "accepted_invalid": nam["accepted"] + gen["wrong"]}
    print(f"tracebacks={tracebacks}")
    print(f"hangs={hangs}")
    print(f"payloads={payloads}")
    for name, n in harm.items():
        print(f"{name}={n}")
    return 0 if tracebacks == hangs == payloads == sum(harm.values()) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
