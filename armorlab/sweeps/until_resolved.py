"""`armorlab sweep SPEC --until-resolved`: seeds in looks until every comparison is resolved.

The spec's ``compare:`` (armorlab.sweeps.until_resolved_compare) names the baseline arm of the compared stage;
every other arm is compared with it on one endpoint by the group-sequential rule of
armorlab.stats.sequential. The spec's seeds are the first look's; each later look gives the
arms still unresolved (and the baseline) ``seeds_per_look`` more seeds — the next seeds after
the spec's largest — up to ``max_seeds``. A run of a later stage brings its parent run along
(the parent of the same seed; none new when the stage continues from one seed).

The state is the sweep dir itself: ``looks.json`` (written atomically under the sweep's lock)
holds the design, every look's record (its runs, values, boundary, verdicts; who decided it and
when) and ``chain``: where the spec and profile are, the Slurm decision jobs and why a chain
stopped. Which look comes next and which of its runs are still to run follow from looks.json
and the runs' states, so every entry point — the local loop, a decision job, a re-run of the
command — does the same thing from wherever the last one stopped (``advance``):

- all runs of the current look completed: decide it (armorlab.analysis.until_resolved_scores reads the
  endpoint as the report does), append it, go on with the next look;
- a run failed (or completed without a value of the endpoint): the chain stops and says which
  and why (``--retry failed`` resumes it);
- else, on Slurm: queue the look's runs that have no live job (arrays, as `armorlab sweep`
  queues them) and one decision job, ``--dependency=afterany`` on the look's jobs, which runs
  ``python -m armorlab.sweeps.until_resolved <sweep dir>`` — this module's ``advance`` — and so
  decides the look and queues the next one itself. A decision job never resubmits a run that
  already had a job: one that ended without completing stops the chain until the command is
  run again. Locally the command runs the look's runs in the foreground and loops.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from armorlab.core.checks import Invalid
from armorlab.core.fsutil import atomic_write_text
from armorlab.core.runs import RunDir, now_iso
from armorlab.errors import ArmorLabError
from armorlab.stats.margins import PREVENTION_ENDPOINTS, margin_source
from armorlab.stats.sequential import (
    Design,
    decide_look,
    latest_comparisons,
)
from armorlab.stats.sequential_text import design_line, endpoint_label, look_line, sentence
from armorlab.stats.verdicts import LOWER_IS_BETTER
from armorlab.sweeps import slurmctl
from armorlab.sweeps.controls import arm_key, matches
from armorlab.sweeps.manifest import (
    LOGS_DIR,
    LOOKS,
    SPEC_COPY,
    is_local,
    load_manifest,
    locked,
    parent_failed_reason,
)
from armorlab.sweeps.profile import Profile
from armorlab.sweeps.sbatch import script_value
from armorlab.sweeps.spec import RunPlan, SweepSpec, control_pairs, describe_point, expand
from armorlab.sweeps.submit import (
    ACTIVE,
    BLOCKED,
    DONE,
    FAILED,
    SUBMIT,
    WAIT,
    SweepPlan,
    load_sweep,
    plan_runs,
    submit_slurm,
)
from armorlab.sweeps.until_resolved_compare import CompareSpec, from_controls
from armorlab.sweeps.until_resolved_looks import extend_spec, read_looks, write_looks

log = logging.getLogger(__name__)

DEFAULT_MAX_SEEDS, DEFAULT_SEEDS_PER_LOOK = 10, 2
DECISION_TIME_MIN, DECISION_MEM = 30, "2G"
MAX_SEEDS_LIMIT = 1_000  # --max-seeds and --seeds-per-look: each seed is a training run per arm
# the design keys a re-run may not change once a look is recorded (the error rate assumes them)
FIXED_KEYS = ("baseline", "arms", "endpoint", "alpha", "spending", "first_look", "power", "higher_is_better")
ACTION_WORDS = {SUBMIT: "to run", DONE: "completed", ACTIVE: "queued/running", FAILED: "failed",
                BLOCKED: "not started: parent failed", WAIT: "waiting for a parent run elsewhere"}


class ChainStopped(Exception):
    """A look cannot be decided until someone acts (a run failed, a value is missing)."""


@dataclass
class Standing:
    """Where a chain stands: the design, the looks so far, the seeds each arm has at the look in
    progress (``want``), that look's runs and what `armorlab sweep` would do with each."""
    design: Design
    looks: list[dict[str, Any]]
    chain: dict[str, Any]
    want: dict[str, int]
    plan: SweepPlan

    @property
    def finished(self) -> bool:
        return bool(self.looks) and bool(self.looks[-1].get("done"))

    @property
    def look(self) -> int:
        return len(self.looks) if self.finished else len(self.looks) + 1

    @property
    def ready(self) -> bool:
        return all(self.plan.actions[r.run_id] == DONE for r in self.plan.runs)

    @property
    def stopped(self) -> str | None:
        s = self.chain.get("stopped")
        return s.get("reason") if isinstance(s, dict) and s.get("look") == self.look else None

    def decision_jobs(self) -> list[str]:
        return [d["job_id"] for d in self.chain.get("decision_jobs", ()) if d.get("look") == self.look]


class Chain:
    """A sweep run until resolved: the spec (expanded to ``max_seeds`` seeds per arm), its arms,
    the design, and the sweep dir it lives in."""

    def __init__(self, spec: SweepSpec, profile: Profile, executor: str, *, root: str | Path,
                 max_seeds: int | None = None, seeds_per_look: int | None = None, retry_failed: bool = False,
                 self_job: str | None = None) -> None:
        self.spec, self.profile, self.executor = spec, profile, executor
        self.sweep_dir = Path(root) / spec.name
        self.root = Path(root)
        self.retry_failed = retry_failed
        self.self_job = self_job  # this process's own Slurm job (a decision job): never "a live decision job"
        self.compare, self.stage = self._comparison()
        recorded, looks, chain = read_looks(self.sweep_dir)
        n_max = max_seeds if max_seeds is not None else (recorded.max_seeds if recorded else DEFAULT_MAX_SEEDS)
        k = seeds_per_look if seeds_per_look is not None else \
            (recorded.seeds_per_look if recorded else DEFAULT_SEEDS_PER_LOOK)
        for key, v in (("--max-seeds", n_max), ("--seeds-per-look", k)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ArmorLabError("must be a positive integer", key=key, value=v)
            if v > MAX_SEEDS_LIMIT:  # the runs are planned up front: 10^9 seeds would never finish planning
                raise ArmorLabError(f"must be at most {MAX_SEEDS_LIMIT:,} (seeds per arm; each is a training run)",
                                    key=key, value=v)
        extended, self.seeds, self.first = extend_spec(spec, self.stage_name, n_max)
        runs = expand(extended)
        self.order = [r.run_id for r in runs]
        self.runs = {r.run_id: r for r in runs}
        original = expand(spec)
        self.original = [r.run_id for r in original]
        self.controls = control_pairs(spec, original)
        self.arm_runs, arm_configs = self._arms([r for r in runs if r.stage == self.stage])
        baseline = self._baseline(arm_configs)
        template = self._design(baseline, [a for a in self.arm_runs if a != baseline], n_max, k)
        self.design = self._settle(template, recorded, looks, explicit={"max_seeds": max_seeds, "seeds_per_look":
                                                                        seeds_per_look})

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_sweep_dir(cls, sweep_dir: str | Path, *, self_job: str | None = None) -> Chain:
        """The chain a decision job continues: the sweep dir's spec copy and the recorded profile."""
        sweep_dir = Path(sweep_dir).absolute()
        _, _, chain = read_looks(sweep_dir)
        if not chain:
            raise ArmorLabError("no sequential sweep here (no looks.json with a chain record)", key="SWEEP_DIR",
                                value=str(sweep_dir))
        spec, prof, executor = load_sweep(sweep_dir / chain.get("spec", SPEC_COPY),
                                          executor=chain.get("executor", "slurm"), profile=chain.get("profile"))
        if spec.name != sweep_dir.name:
            raise ArmorLabError("the spec copy names another sweep", key="name", value=spec.name,
                                file=str(sweep_dir / SPEC_COPY))
        return cls(spec, prof, executor, root=sweep_dir.parent, self_job=self_job)

    @property
    def stage_name(self) -> str:
        return self.stage if self.stage is not None else self.spec.name

    def _comparison(self) -> tuple[CompareSpec, str | None]:
        spec = self.spec
        stages = spec.stage_list()
        name = (spec.compare.stage if spec.compare is not None and spec.compare.stage else stages[-1].name)
        stage = next(st for st in stages if st.name == name)
        if spec.compare is not None:
            cmp_ = spec.compare
        elif stage.controls:
            where = "controls" if spec.stages is None else f"stages.{stage.name}.controls"
            cmp_ = from_controls(stage.controls, where, spec.file)
        else:
            raise ArmorLabError("--until-resolved needs to know what to compare: add `compare: {baseline: "
                                "{objective: dapo}}` (the baseline arm; docs/verdicts.md) or `controls:`",
                                key="compare", value=None, file=spec.file)
        return cmp_, (name if spec.stages is not None else None)

    def _arms(self, runs: list[RunPlan]) -> tuple[dict[str, dict[int, str]], dict[str, dict[str, Any]]]:
        """Arm label → {seed: run id}, and arm label → a config of the arm (for the selectors)."""
        keys: dict[str, str] = {}
        arms: dict[str, dict[int, str]] = {}
        configs: dict[str, dict[str, Any]] = {}
        for r in runs:
            k = arm_key(r.view)
            if k not in keys:
                label = describe_point({p: v for p, v in r.point.items() if p != "seed"})
                while label in arms:
                    label += "'"
                keys[k] = label
                arms[label] = {}
                configs[label] = dict(r.view)
            label = keys[k]
            seed = r.view["seed"]
            if seed in arms[label]:
                raise ArmorLabError(f"arm {label} has more than one run of seed {seed} (the stage continues "
                                    "from a grid): --until-resolved compares one run per arm and seed",
                                    key="compare.stage", value=self.stage_name, file=self.spec.file)
            arms[label][seed] = r.run_id
        if len(arms) < 2:
            raise ArmorLabError("needs a baseline and at least one other arm to compare",
                                key="compare.stage", value=self.stage_name, file=self.spec.file)
        return arms, configs

    def _baseline(self, configs: Mapping[str, Mapping[str, Any]]) -> str:
        found = [a for a, cfg in configs.items() if matches(cfg, self.compare.baseline)]
        if len(found) != 1:
            raise ArmorLabError(f"the baseline must select exactly one arm of stage {self.stage_name!r}; it selects "
                                f"{len(found)} ({'; '.join(found) or 'none'}; arms: {'; '.join(configs)})",
                                key=self.compare.where if self.compare.where != "compare" else "compare.baseline",
                                value=self.compare.baseline, file=self.spec.file)
        return found[0]

    def _design(self, baseline: str, arms: list[str], n_max: int, k: int) -> Design:
        c = self.compare
        if self.first < 2:
            raise ArmorLabError("the first look needs at least 2 seeds per arm", key="seeds", value=self.seeds,
                                file=self.spec.file)
        if n_max < self.first:
            raise ArmorLabError(f"must be at least the first look's {self.first} seeds", key="--max-seeds",
                                value=n_max)
        higher = c.endpoint not in LOWER_IS_BETTER and c.select["mode"] == "max"
        return Design(baseline=baseline, arms=tuple(arms), endpoint=c.endpoint,
                      delta=math.nan if c.delta is None else c.delta, alpha=c.alpha, spending=c.spending,
                      first_look=self.first, seeds_per_look=k, max_seeds=n_max, higher_is_better=higher)

    def _settle(self, template: Design, recorded: Design | None, looks: list[dict[str, Any]],
                explicit: Mapping[str, int | None]) -> Design:
        """The design in force: this command's until a look is recorded, then looks.json's — a
        re-run that would change it is refused (the error rate holds for the design it started with)."""
        if recorded is None or not looks:
            return template
        file = str(self.sweep_dir / LOOKS)
        for key in FIXED_KEYS:
            if getattr(template, key) != getattr(recorded, key):
                raise ArmorLabError(f"looks.json fixes {key} = {getattr(recorded, key)!r} after {len(looks)} look(s); "
                                    f"this spec makes it {getattr(template, key)!r}. A sequential design cannot change "
                                    "once it has looked: give the sweep another name to start a new one",
                                    key=f"design.{key}", value=getattr(template, key), file=file)
        for key, flag in (("max_seeds", "--max-seeds"), ("seeds_per_look", "--seeds-per-look")):
            if explicit[key] is not None and explicit[key] != getattr(recorded, key):
                raise ArmorLabError(f"looks.json fixes {key} = {getattr(recorded, key)} after {len(looks)} look(s)",
                                    key=flag, value=explicit[key], file=file)
        if not (math.isnan(template.delta) and math.isnan(recorded.delta)
                or math.isclose(template.delta, recorded.delta)):  # a margin is fixed before the first look
            fixed = "no margin" if math.isnan(recorded.delta) else f"δ = {recorded.delta}"
            raise ArmorLabError(f"looks.json fixes {fixed} after {len(looks)} look(s)", key="compare.delta",
                                value=self.compare.delta, file=file)
        return recorded

    # ------------------------------------------------------------------ standing
    def want(self, looks: Sequence[Mapping[str, Any]]) -> dict[str, int]:
        """Seeds each arm has at the look in progress (after the last look: what it asked for)."""
        want = {a: self.design.first_look for a in (self.design.baseline, *self.design.arms)}
        for look in looks:
            want.update({a: int(n) for a, n in (look.get("next") or {}).items()})
        return want

    def look_run_ids(self, want: Mapping[str, int]) -> dict[str, str]:
        """The compared runs of a look: run id → arm."""
        return {self.arm_runs[a][s]: a for a, n in want.items() for s in self.seeds[:n]}

    def look_runs(self, want: Mapping[str, int]) -> list[RunPlan]:
        """Every run a look needs, in plan order: the spec's own (the first look's), each arm's
        seeds so far, and the runs those continue from."""
        ids = set(self.original)
        for rid in self.look_run_ids(want):
            while rid is not None and rid not in ids:
                ids.add(rid)
                rid = self.runs[rid].parent
        return [self.runs[r] for r in self.order if r in ids]

    def sweep_plan(self, runs: list[RunPlan]) -> SweepPlan:
        return plan_runs(self.spec, runs, root=self.root, profile=self.profile, executor=self.executor,
                         retry_failed=self.retry_failed, controls=self.controls)

    def stand(self) -> Standing:
        _, looks, chain = read_looks(self.sweep_dir)
        want = self.want(looks)
        return Standing(self.design, looks, chain, want, self.sweep_plan(self.look_runs(want)))

    def chain_record(self, old: Mapping[str, Any]) -> dict[str, Any]:
        """looks.json's ``chain``: what a decision job needs to continue, and the history it keeps."""
        margin = old.get("margin") or {"delta": self.compare.delta,
                                        "source": margin_source(self.compare.delta, self.spec.file)}
        return {**old, "spec": SPEC_COPY, "executor": self.executor, "margin": margin,
                "profile": str(self.profile.path.absolute()) if self.profile.path else None}

    def begin(self) -> None:
        """Write looks.json before the first look: the design, its margin and the margin's source."""
        with locked(self.sweep_dir):
            _, looks, chain = read_looks(self.sweep_dir)
            if not looks:
                write_looks(self.sweep_dir, self.design, [], self.chain_record(chain))

    def problem(self, st: Standing, *, resubmit: bool) -> str | None:
        """Why the look in progress cannot go on without someone acting, or None."""
        manifest = load_manifest(self.sweep_dir)
        bad = []
        for r in st.plan.runs:
            action = st.plan.actions[r.run_id]
            if action == FAILED:
                status = _status(self.sweep_dir / r.run_id)
                bad.append(f"run {r.run_id} failed: {status.get('reason') or 'no reason recorded'}")
            elif action == BLOCKED:
                bad.append(f"run {r.run_id} failed: {parent_failed_reason(r.parent, None)}")
            elif action == SUBMIT and not resubmit and manifest is not None and manifest.last_job(r.run_id):
                status = _status(self.sweep_dir / r.run_id)
                bad.append(f"run {r.run_id} ended without completing ({status.get('state')}"
                           f"{': ' + status['reason'] if status.get('reason') else ''})")
        if not bad:
            return None
        fix = ("run `armorlab sweep ... --until-resolved --retry failed` once fixed" if any("failed" in b for b in bad)
               else "run `armorlab sweep ... --until-resolved` again to resume them")
        return f"look {st.look} waits: {'; '.join(bad[:5])}{' …' if len(bad) > 5 else ''}; {fix}"

    def record_stop(self, st: Standing, reason: str | None) -> None:
        """Record why the chain stopped at the look in progress (None: it goes on again)."""
        with locked(self.sweep_dir):
            design, looks, chain = read_looks(self.sweep_dir)
            chain = self.chain_record(chain)
            chain.pop("stopped", None)
            if reason is not None:
                chain["stopped"] = {"look": st.look, "reason": reason, "at": now_iso()}
            write_looks(self.sweep_dir, design or self.design, looks, chain)

    # ------------------------------------------------------------------ deciding
    def decide(self, st: Standing, *, by: str) -> dict[str, Any] | None:
        """Decide the look in progress (its runs all completed) and append it to looks.json; None
        when another process recorded it meanwhile. Raises ChainStopped when a run has no value."""
        from armorlab.analysis.recipe import Select  # lazy: pandas, for the decision only (both lines)
        from armorlab.analysis.until_resolved_scores import score_runs

        compared = self.look_run_ids(st.want)
        matched = [self.compare.matched_step] if self.compare.matched_step is not None else []
        scores = score_runs({rid: self.sweep_dir / rid for rid in compared}, compared, self.design.endpoint,
                            Select(**self.compare.select), matched_steps=matched)
        missing = [rid for rid in compared if not math.isfinite(scores.value[rid])]
        if missing:
            raise ChainStopped(f"look {st.look} waits: run(s) {', '.join(missing[:5])} completed without a value of "
                               f"{self.design.endpoint} (no {self.compare.select['metric']} evaluations?)")
        with locked(self.sweep_dir):
            design, looks, chain = read_looks(self.sweep_dir)
            if len(looks) != len(st.looks):
                return None  # decided by someone else while we read the runs
            design = self.design if not looks or design is None else design
            chain = self.chain_record(chain)
            look = decide_look(design, scores.values_by_arm(design.endpoint), looks)
            if design.endpoint in PREVENTION_ENDPOINTS:
                look["prevention"] = scores.fall(design.baseline)
            look["runs"] = {a: {str(s): self.arm_runs[a][s] for s in self.seeds[:n]} for a, n in st.want.items()}
            look["decided"], look["by"] = now_iso(), by
            chain.pop("stopped", None)
            write_looks(self.sweep_dir, design, [*looks, look], chain)
            self.design = design
        return look

    # ------------------------------------------------------------------ Slurm decision jobs
    def live_decision_job(self, st: Standing) -> str | None:
        ids = [j for j in st.decision_jobs() if j != self.self_job]
        if not ids:
            return None
        try:
            states = slurmctl.squeue_states(ids)
        except slurmctl.SlurmUnavailable as exc:  # guessing "gone" could queue a second decision job
            raise ArmorLabError(f"cannot tell whether the decision job is still queued ({exc})", key="sweep",
                                value=str(self.sweep_dir)) from None
        live = [j for j in ids if slurmctl.is_active(states.get(j))]
        return live[-1] if live else None

    def waiting_on(self, st: Standing) -> list[str]:
        """The live Slurm jobs of the look's runs (array ids where a whole array belongs to them)."""
        manifest = load_manifest(self.sweep_dir)
        jobs = [j for r in st.plan.runs if st.plan.actions[r.run_id] == ACTIVE
                and (j := manifest.last_job(r.run_id)) and not is_local(j)] if manifest else []
        return list(dict.fromkeys(slurmctl.base_id(j) for j in jobs))

    def decision_script(self, look: int, after: Sequence[str]) -> str:
        prof = self.profile
        logs = self.sweep_dir.absolute() / LOGS_DIR
        python = prof.python if prof.python is not None else shlex.quote(sys.executable)
        options = {"job-name": f"{self.spec.name}-look{look}", "dependency": "afterany:" + ":".join(after),
                   "ntasks": 1, "cpus-per-task": 1, "mem": DECISION_MEM,
                   "time": max(1, min(DECISION_TIME_MIN, prof.time_min)),
                   "output": str(logs / f"decision-look{look}-%j.out"), "open-mode": "append"}
        for key in ("partition", "account", "qos"):
            if getattr(prof, key) is not None:
                options[key] = getattr(prof, key)
        lines = ["#!/bin/bash", "# armorlab: the decision after a look of a sweep run until resolved"]
        try:
            lines += [f"#SBATCH --{k}={shlex.quote(str(script_value(v)))}" for k, v in options.items()]
            command = f"exec {python} -m armorlab.sweeps.until_resolved {shlex.quote(str(script_value(self.sweep_dir.absolute())))}"
        except Invalid as exc:
            raise ArmorLabError(str(exc), key="--root (the sweep dir's path)", value=str(self.sweep_dir)) from None
        return "\n".join([*lines, "", *prof.setup, command, ""])

    def submit_decision(self, st: Standing, after: Sequence[str]) -> str:
        """Queue the decision job of the look in progress, after ``after`` (afterany); record it."""
        logs = self.sweep_dir / LOGS_DIR
        logs.mkdir(parents=True, exist_ok=True)
        script = logs / f"decision-look{st.look}.sh"
        atomic_write_text(script, self.decision_script(st.look, after), within=self.sweep_dir)
        try:
            out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ArmorLabError(f"sbatch refused the decision job: {exc}", key="profile",
                                value=str(self.profile.path) if self.profile.path else None) from None
        if out.returncode != 0 or not out.stdout.strip():
            raise ArmorLabError(f"sbatch refused the decision job: {(out.stderr or out.stdout).strip()}",
                                key="profile", value=str(self.profile.path) if self.profile.path else None)
        job = out.stdout.strip().split(";", 1)[0]
        design, looks, chain = read_looks(self.sweep_dir)
        chain = self.chain_record(chain)
        chain["decision_jobs"] = [*chain.get("decision_jobs", []), {"look": st.look, "job_id": job,
                                                                     "after": list(after), "submitted": now_iso()}]
        chain.pop("stopped", None)
        write_looks(self.sweep_dir, design or self.design, looks, chain)
        return job


def _status(run_dir: Path) -> dict[str, Any]:
    try:
        return RunDir(run_dir).read_status()
    except (OSError, ArmorLabError):
        return {"state": "unknown"}


# --------------------------------------------------------------------------- advancing
OnLook = Callable[[dict[str, Any], Design], None]


def advance(chain: Chain, *, by: str, resubmit: bool = True, on_look: OnLook | None = None) -> Standing:
    """Take the chain as far as it goes now (see the module docstring). Locally it returns when
    the look in progress has runs to run here (the caller runs them and calls again), or when
    the chain has finished or stopped; on Slurm once the look's jobs and its decision job are
    queued."""
    chain.begin()
    while True:
        st = chain.stand()
        if st.finished:
            return st
        if st.ready:
            try:
                look = chain.decide(st, by=by)
            except ChainStopped as exc:
                chain.record_stop(st, str(exc))
                return chain.stand()
            if look is not None and on_look is not None:
                on_look(look, chain.design)
            continue
        why = chain.problem(st, resubmit=resubmit)
        if why is not None:
            chain.record_stop(st, why)
            return chain.stand()
        if st.stopped:  # what stopped it is mended (a retry, runs resumed): it goes on
            chain.record_stop(st, None)
            st = chain.stand()
        if chain.executor != "slurm":
            return st
        if any(st.plan.actions[r.run_id] == SUBMIT for r in st.plan.runs) and submit_slurm(st.plan):
            continue  # their state has changed: look again
        with locked(chain.sweep_dir):
            st = chain.stand()
            if st.ready or chain.live_decision_job(st) is not None:
                if st.ready:
                    continue
                return st
            after = chain.waiting_on(st)
            if not after:  # the look waits for runs outside Slurm's reach: a later re-run goes on
                return st
            chain.submit_decision(st, after)
        return chain.stand()


def describe(st: Standing, chain: Chain) -> list[str]:
    """Where a chain stands, in lines: the design, each look, the look in progress or the verdicts."""
    label = endpoint_label(st.design.endpoint, chain.compare.select["metric"], chain.compare.select["report"])
    lines = [f"until resolved: {design_line(st.design, label, (st.chain.get('margin') or {}).get('source'))}"]
    lines += [look_line(look, st.design) for look in st.looks]
    if st.finished:
        lines.append(f"finished after {len(st.looks)} look(s):")
        lines += [f"  {sentence(c, st.design, st.looks, label)}" for c in latest_comparisons(st.looks).values()]
        return lines
    counts: dict[str, int] = {}
    for r in st.plan.runs:
        what = ACTION_WORDS.get(st.plan.actions[r.run_id], st.plan.actions[r.run_id])
        counts[what] = counts.get(what, 0) + 1
    sizes = ", ".join(f"{a} {n}" for a, n in st.want.items())
    state = ", ".join(f"{n} {k}" for k, n in counts.items())
    lines.append(f"look {st.look} (seeds per arm: {sizes}): {len(st.plan.runs)} runs, {state}")
    jobs = st.decision_jobs()
    if jobs:
        try:
            states = slurmctl.squeue_states(jobs)
        except slurmctl.SlurmUnavailable:
            states = {}
        lines.append(f"decision job {jobs[-1]} ({states.get(jobs[-1], 'ended')}), afterany on this look's jobs")
    if st.stopped:
        lines.append(f"stopped: {st.stopped}")
    return lines


# --------------------------------------------------------------------------- the decision job
def _clean_slurm_env() -> str | None:
    """The decision job's own id; its Slurm variables are removed so that what it queues is not
    taken for a step of it (SLURM_CONF stays: it says which cluster)."""
    own = os.environ.get("SLURM_JOB_ID")
    for key in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        del os.environ[key]
    return own


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="The decision after a look of `armorlab sweep --until-resolved` "
                                             "(run as a Slurm job after the look's jobs).")
    ap.add_argument("sweep_dir")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    own = _clean_slurm_env()
    chain = None
    try:
        chain = Chain.from_sweep_dir(args.sweep_dir, self_job=own)
        st = advance(chain, by=f"slurm job {own}" if own else "decision job", resubmit=False,
                     on_look=lambda look, design: print(look_line(look, design), flush=True))
    except ArmorLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if chain is not None:  # `armorlab status` and a re-run say why the chain stopped
            chain.record_stop(chain.stand(), f"the decision job failed: {exc}")
        return 2
    print("\n".join(describe(st, chain)))
    return 1 if st.stopped else 0  # a stopped chain waits for someone: sacct shows it


if __name__ == "__main__":
    sys.exit(main())
