"""`armorlab sweep --until-resolved` on this machine: which seeds each look adds (stages included),
resuming from looks.json, refusing a changed design, the local foreground loop end to end with the
stand-in trainer (tests/sweep_standin.py), a stopped chain, the report reading looks.json, and the
decision job's sbatch script. The Slurm chain is tests/test_sweep_slurm_until_resolved.py.

The stand-in's val/acc is flat per run under ARMORLAB_STANDIN_VAL_LEVELS, level + spread·(u − ½),
u = ((seed·7919 + 31) mod 1000)/1000 (restated below). At levels dapo 0.50, armor 0.90, up 0.55
(spread 0.02), seeds 0–2 give Welch's t = 48.1 for armor (ν = 4; its look-1 boundary at Holm's
α/2 is |t| ≥ 27.6) and 6.0 for up (boundary at α once armor is rejected: 16.2); at look 2, seeds
0–4, up's t is 10.7 against 4.19. So armor is resolved at the first look and up at the second.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from model_dirs import fake_model_dir
from sweep_support import VAL_LEVELS as LEVELS
from sweep_support import run_cli, standin_command, write_spec
from sweep_support import standin_val_level as val_level

from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError
from armorlab.stats.sequential import SPENDING, Design, decide_look, looks_record
from armorlab.stats.sequential_text import sentence
from armorlab.sweeps.jobs import ENV_COMMAND
from armorlab.sweeps.manifest import LOOKS, load_manifest
from armorlab.sweeps.submit import load_sweep
from armorlab.sweeps.until_resolved import Chain
from armorlab.sweeps.until_resolved_compare import SPENDINGS
from armorlab.sweeps.until_resolved_looks import extended_seeds

SELECT = {"metric": "val/acc", "mode": "max"}


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, standin_command())
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", "0.005")
    monkeypatch.setenv("ARMORLAB_STANDIN_VAL_LEVELS", json.dumps(LEVELS))


def _flat_spec(tmp_path, name="flat", **extra):
    spec = {"name": name, "base": {"max_steps": 3, "val_every": 1, "save_steps": 3},
            "grid": {"objective": ["dapo", "armor", "up"]}, "seeds": [0, 1, 2],
            "compare": {"baseline": {"objective": "dapo"}, "delta": 0.05}, **extra}
    return write_spec(tmp_path / f"{name}.yaml", spec)


def _staged_spec(tmp_path, name="staged", seeds_from="same"):
    spec = {"name": name, "base": {"max_steps": 3, "val_every": 1, "save_steps": 3}, "seeds": [0, 1, 2],
            "stages": [{"name": "warm"},
                       {"name": "cont", "from": {"stage": "warm", "select": SELECT, "seeds": seeds_from},
                        "grid": {"objective": ["dapo", "armor", "up"]}}],
            "compare": {"baseline": {"objective": "dapo"}, "delta": 0.05}}
    return write_spec(tmp_path / f"{name}.yaml", spec)


def _chain(spec, root, **kw) -> Chain:
    s, prof, ex = load_sweep(spec, executor="local")
    return Chain(s, prof, ex, root=root, **kw)


# --------------------------------------------------------------------------- which seeds a look adds
def test_looks_extend_the_specs_seeds_and_bring_the_parents_of_new_seeds(tmp_path):
    assert extended_seeds([0, 1, 2], 7) == [0, 1, 2, 3, 4, 5, 6]
    assert extended_seeds([5, 9, 11], 5) == [5, 9, 11, 12, 13]
    chain = _chain(_staged_spec(tmp_path), tmp_path / "runs")
    assert chain.design.schedule() == [3, 5, 7, 9, 10]
    assert (chain.design.baseline, chain.design.arms) == ("objective=dapo", ("objective=armor", "objective=up"))
    first = chain.look_runs(chain.want([]))
    assert len(first) == 3 + 9 and {r.view["seed"] for r in first} == {0, 1, 2}
    # look 2: armor resolved (3 seeds), dapo and up at 5 — and the warm-up runs of seeds 3 and 4
    runs = chain.look_runs({"objective=dapo": 5, "objective=armor": 3, "objective=up": 5})
    got = sorted((r.stage, r.view["objective"], r.view["seed"]) for r in runs)
    want = sorted([("warm", "dapo", s) for s in range(5)] + [("cont", "dapo", s) for s in range(5)]
                  + [("cont", "armor", s) for s in range(3)] + [("cont", "up", s) for s in range(5)])
    assert got == want
    by_id = {r.run_id: r for r in runs}
    for r in runs:  # a continuing run comes after the run it continues from, which is in the look
        if r.parent is not None:
            assert r.parent in by_id and runs.index(by_id[r.parent]) < runs.index(r)
            assert by_id[r.parent].view["seed"] == r.view["seed"]
    # a stage continuing from one seed needs no new parents
    one = _chain(_staged_spec(tmp_path, "one", seeds_from=0), tmp_path / "runs")
    runs = one.look_runs({"objective=dapo": 5, "objective=armor": 3, "objective=up": 5})
    assert sorted(r.view["seed"] for r in runs if r.stage == "warm") == [0, 1, 2]  # the spec's own
    assert {r.parent for r in runs if r.stage == "cont"} == {r.run_id for r in runs if r.stage == "warm"
                                                              and r.view["seed"] == 0}
    # a mapping that names no parent for a seed a look would add: refused before anything runs
    with pytest.raises(ArmorLabError, match="from.seeds") as err:
        _chain(_staged_spec(tmp_path, "mapped", seeds_from={0: 0, 1: 1, 2: 2}), tmp_path / "runs")
    assert "seed 3" in str(err.value)


def test_the_comparison_comes_from_compare_or_controls_and_bad_ones_are_named(tmp_path):
    base = {"base": {"max_steps": 2}, "grid": {"objective": ["dapo", "armor"]}, "seeds": [0, 1, 2]}
    controls = {"baseline": {"alpha": 0.9}, "arms": [{"select": {"alpha": 0.7}, "factor": ["alpha"]}]}
    spec = write_spec(tmp_path / "c.yaml", {"name": "c", "base": {"max_steps": 2, "objective": "armor"},
                                            "grid": {"alpha": [0.9, 0.7]}, "seeds": [0, 1, 2], "controls": controls})
    chain = _chain(spec, tmp_path / "runs")
    assert chain.design.baseline == "alpha=0.9" and chain.design.arms == ("alpha=0.7",)
    assert chain.compare.endpoint == "final" and math.isnan(chain.design.delta)
    cases = [
        ({"compare": {"baseline": {"objective": "grpo"}}}, "compare.baseline", "selects 0"),
        ({"compare": {"baseline": {"max_steps": 2}}}, "compare.baseline", "selects 2"),
        ({"compare": {"baseline": {"objective": "dapo"}, "endpoint": "bogus"}}, "compare.endpoint", "per-run"),
        ({"compare": {"baseline": {"objective": "dapo"}, "delta": -1}}, "compare.delta", "> 0"),
        ({"compare": {"baseline": {"objective": "dapo"}, "spending": "haybittle"}}, "compare.spending", "obf"),
        ({"compare": {"baseline": {"objective": "dapo"}, "colour": 1}}, "compare.colour", "unknown"),
        ({}, "compare", "what to compare"),
        ({"compare": {"baseline": {"objective": "dapo"}}, "seeds": None}, "seeds", "seeds"),
        ({"compare": {"baseline": {"objective": "dapo"}}, "seeds": [0]}, "seeds", "at least 2"),
    ]
    for i, (extra, key, words) in enumerate(cases):
        path = write_spec(tmp_path / f"bad{i}.yaml", {"name": f"bad{i}", **{**base, **extra}})
        with pytest.raises(ArmorLabError) as err:
            _chain(path, tmp_path / "runs")
        assert f"'{key}'" in str(err.value) and words in str(err.value) and str(path) in str(err.value), err.value
    ok = _flat_spec(tmp_path)
    with pytest.raises(ArmorLabError, match="--max-seeds"):
        _chain(ok, tmp_path / "runs", max_seeds=2)
    out = run_cli("sweep", str(ok), "--root", str(tmp_path / "runs"), "--max-seeds", "5")
    assert out.returncode == 2 and "only with --until-resolved" in out.stderr and "Traceback" not in out.stderr
    assert SPENDINGS == SPENDING  # the spec's choices are the statistics'


# --------------------------------------------------------------------------- resuming from looks.json
def test_a_chain_resumes_from_looks_json_and_refuses_a_changed_design(tmp_path):
    spec, root = _flat_spec(tmp_path), tmp_path / "runs"
    chain = _chain(spec, root)
    design = chain.design
    values = {a: [val_level(s, *LEVELS[a.split("=")[1]]) for s in range(3)] for a in (design.baseline, *design.arms)}
    look = decide_look(design, values, [])
    assert look["next"] == {"objective=up": 5, "objective=dapo": 5} and not look["done"]
    (root / "flat").mkdir(parents=True)
    (root / "flat" / LOOKS).write_text(json.dumps({**looks_record(design, [look]), "chain": {"spec": "spec.yaml"}}))
    again = _chain(spec, root)
    st = again.stand()
    assert st.look == 2 and st.want == {"objective=dapo": 5, "objective=armor": 3, "objective=up": 5}
    assert len(st.plan.runs) == 13 and all(a == "submit" for a in st.plan.actions.values())
    with pytest.raises(ArmorLabError, match="design.endpoint"):
        edited = _load_yaml(spec)
        edited["compare"]["endpoint"] = "drop"
        _chain(write_spec(tmp_path / "flat2.yaml", {**edited, "name": "flat"}), root)
    with pytest.raises(ArmorLabError, match="--seeds-per-look"):
        _chain(spec, root, seeds_per_look=3)
    (root / "flat" / LOOKS).write_text(json.dumps({**looks_record(design, []), "chain": {}}))
    assert _chain(spec, root, seeds_per_look=3).design.seeds_per_look == 3  # nothing looked yet: free


def _load_yaml(path: Path):
    import yaml

    return yaml.safe_load(path.read_text())


# --------------------------------------------------------------------------- end to end, locally
def test_until_resolved_locally_stops_resolved_arms_adds_seeds_to_open_ones_and_reports_the_looks(tmp_path, standin):
    spec, root = _staged_spec(tmp_path), tmp_path / "runs"
    out = run_cli("sweep", str(spec), "--root", str(root), "--until-resolved", "--workers", "2", timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    sweep_dir = root / "staged"
    record = json.loads((sweep_dir / LOOKS).read_text())
    looks = record["looks"]
    assert [lk["look"] for lk in looks] == [1, 2] and looks[-1]["done"] and not looks[0]["done"]
    first = {c["arm"]: c for c in looks[0]["comparisons"]}
    assert first["objective=armor"]["verdict"] == "better" and first["objective=up"]["verdict"] == "continue"
    assert looks[0]["next"] == {"objective=up": 5, "objective=dapo": 5}
    second = {c["arm"]: c for c in looks[1]["comparisons"]}
    assert second["objective=up"]["verdict"] == "better" and second["objective=up"]["n"] == [5, 5]
    assert second["objective=armor"]["carried"] and second["objective=armor"]["n"] == [3, 3]
    for look, n in ((looks[0], 3), (looks[1], 5)):  # the values the looks decided on, by the formula
        for arm in ("objective=dapo", "objective=up"):
            want = sorted(val_level(s, *LEVELS[arm.split("=")[1]]) for s in range(n))
            assert np.allclose(sorted(look["stats"][arm]["values"]), want, atol=1e-12)
    x = np.array([val_level(s, *LEVELS["up"]) for s in range(5)])
    y = np.array([val_level(s, *LEVELS["dapo"]) for s in range(5)])
    t = (x.mean() - y.mean()) / math.sqrt(x.var(ddof=1) / 5 + y.var(ddof=1) / 5)
    assert second["objective=up"]["t"] == pytest.approx(t, rel=1e-9)
    # the runs: armor kept its 3 seeds; dapo and up got seeds 3 and 4, each with its warm-up parent
    cont = [RunDir(p.parent) for p in sweep_dir.glob("*/config.yaml")]
    seeds = {}
    for rd in cont:
        cfg = rd.read_config()
        stage = "cont" if cfg.get("init_from") else "warm"
        seeds.setdefault((stage, cfg["objective"]), set()).add(cfg["seed"])
        assert rd.read_status()["state"] == "completed"
        if stage == "cont":  # it started once the run it continues from had completed
            assert json.loads((rd.path / "standin_parent.json").read_text())["state"] == "completed"
    assert seeds == {("warm", "dapo"): set(range(5)), ("cont", "dapo"): set(range(5)),
                     ("cont", "armor"): {0, 1, 2}, ("cont", "up"): set(range(5))}
    assert looks[1]["runs"]["objective=armor"].keys() == {"0", "1", "2"}
    assert record["design"]["delta"] == 0.05 and record["chain"]["margin"]["delta"] == 0.05
    assert "better at look 1, resolved with 3 seeds per arm" in out.stdout
    assert "better at look 2, resolved with 5 seeds per arm" in out.stdout

    # again: where it stands, nothing run, nothing rewritten
    jobs, text = load_manifest(sweep_dir).jobs, (sweep_dir / LOOKS).read_bytes()
    again = run_cli("sweep", str(spec), "--root", str(root), "--until-resolved")
    assert again.returncode == 0 and "finished after 2 look(s)" in again.stdout, again.stdout + again.stderr
    assert load_manifest(sweep_dir).jobs == jobs and (sweep_dir / LOOKS).read_bytes() == text
    status = run_cli("status", str(sweep_dir), env={"COLUMNS": "250"})
    assert "objective=armor: better at look 1; objective=up: better at look 2; finished" in status.stdout

    # the report gives the looks' verdicts (not fixed-sample ones) and notices runs that changed
    record["looks"][1]["stats"]["objective=up"]["values"][0] += 0.25
    (sweep_dir / LOOKS).write_text(json.dumps(record))
    rep = run_cli("report", str(sweep_dir), "--out", str(tmp_path / "rep"), timeout=600)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    sentences = [line for line in rep.stdout.splitlines() if " vs objective=dapo: " in line]
    assert len(sentences) == 2 and "better at look 1" in sentences[0] and "better at look 2" in sentences[1]
    import pandas as pd

    table = pd.read_csv(tmp_path / "rep" / "tables" / "verdicts.csv")
    assert table[["arm", "verdict", "resolved_at_look"]].values.tolist() == [
        ["objective=armor", "better", 1], ["objective=up", "better", 2]]
    assert "recorded final of objective=up" in rep.stderr and "recorded final of objective=armor" not in rep.stderr
    html = (tmp_path / "rep" / "index.html").read_text()
    assert html.index("Verdicts (seeds until resolved)") < html.index("Results per group")


def test_a_failed_run_stops_the_chain_with_the_reason_and_a_retry_resumes_it(tmp_path, standin, monkeypatch):
    monkeypatch.setenv("ARMORLAB_STANDIN_VAL_LEVELS", json.dumps({"dapo": [0.5, 0.02], "up": [0.9, 0.02]}))
    model = tmp_path / "model"  # not a model the stand-in can load, until standin-model is in it
    fake_model_dir(model)
    spec = write_spec(tmp_path / "f.yaml", {"name": "f", "base": {"max_steps": 2, "val_every": 1,
                                                                   "model": str(model)},
                                            "grid": {"objective": ["dapo", "up"]}, "seeds": [0, 1, 2],
                                            "compare": {"baseline": {"objective": "dapo"}, "delta": 0.05}})
    root = tmp_path / "runs"
    out = run_cli("sweep", str(spec), "--root", str(root), "--until-resolved", "--workers", "2")
    assert out.returncode == 1, out.stdout + out.stderr
    record = json.loads((root / "f" / LOOKS).read_text())
    assert record["looks"] == [] and record["chain"]["stopped"]["look"] == 1
    assert "cannot load model" in record["chain"]["stopped"]["reason"] and "--retry failed" in out.stdout
    (model / "standin-model").touch()
    out = run_cli("sweep", str(spec), "--root", str(root), "--until-resolved", "--retry", "failed", "--workers", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    record = json.loads((root / "f" / LOOKS).read_text())
    assert len(record["looks"]) == 1 and record["looks"][0]["done"] and "stopped" not in record["chain"]
    assert record["looks"][0]["comparisons"][0]["verdict"] == "better"


IMPORT_CHECK = """
import sys
from armorlab.cli import app
try:
    app({args!r}, standalone_mode=False)
except SystemExit:
    pass
print("MODULES:" + ",".join(m for m in ("torch", "trl", "transformers", "pandas", "optuna", "matplotlib", "submitit",
                                     "scipy", "armorlab.vllm.servers") if m in sys.modules))
"""


def test_dry_run_shows_the_design_and_the_next_looks_runs_and_starts_light(tmp_path):
    spec = _flat_spec(tmp_path)
    out = run_cli("sweep", str(spec), "--root", str(tmp_path / "runs"), "--until-resolved", "--dry-run",
                  "--max-seeds", "6")
    assert out.returncode == 0, out.stderr
    assert "looks of 3, 5, 6 seeds per arm" in out.stdout and "against objective=dapo" in out.stdout
    assert "would train 9 run(s)" in out.stdout and not (tmp_path / "runs").exists()
    args = ["sweep", str(spec), "--root", str(tmp_path / "runs"), "--until-resolved", "--dry-run", "-e", "slurm"]
    probe = subprocess.run([sys.executable, "-c", IMPORT_CHECK.format(args=args)], capture_output=True, text=True,
                           check=True)
    assert probe.stdout.rsplit("MODULES:", 1)[1].strip() == "", probe.stdout


def test_the_decision_jobs_script_waits_on_the_look_and_keeps_values_on_their_lines(tmp_path):
    from armorlab.sweeps.profile import parse_profile

    spec, prof, _ = load_sweep(_flat_spec(tmp_path), executor="slurm")
    prof = parse_profile({"executor": "slurm", "partition": "cpu", "time_min": 600,
                          "setup": ["source /opt/env/bin/activate"], "python": "python3"})
    chain = Chain(spec, prof, "slurm", root=tmp_path / "runs")
    text = chain.decision_script(2, ["101", "102"])
    lines = text.splitlines()
    assert "#SBATCH --dependency=afterany:101:102" in lines and "#SBATCH --partition=cpu" in lines
    assert "#SBATCH --time=30" in lines and "#SBATCH --job-name=flat-look2" in lines
    assert lines[-2:] == ["source /opt/env/bin/activate",
                          f"exec python3 -m armorlab.sweeps.until_resolved {tmp_path / 'runs' / 'flat'}"]
    evil = Chain(spec, prof, "slurm", root=tmp_path / "x\ntouch pwned")
    with pytest.raises(ArmorLabError, match="control character"):
        evil.decision_script(1, ["1"])


@pytest.mark.parametrize("flag", ["--max-seeds", "--seeds-per-look"])
def test_seed_counts_past_a_thousand_are_refused_at_once(tmp_path, flag):
    import time

    spec = _flat_spec(tmp_path)
    t0 = time.perf_counter()
    with pytest.raises(ArmorLabError, match=f"at most 1,000.*key '{flag}', value 1000000000"):
        _chain(spec, tmp_path / "runs", **{flag.removeprefix("--").replace("-", "_"): 10**9})
    assert time.perf_counter() - t0 < 5
    assert _chain(spec, tmp_path / "runs", max_seeds=1000).design.max_seeds == 1000


def test_words_for_an_arm_not_resolved_at_max_seeds():

    design = Design(baseline="b", arms=("a",), endpoint="final", delta=0.05, first_look=3, max_seeds=3)
    values = {"b": [0.50, 0.60, 0.40], "a": [0.52, 0.62, 0.38]}
    look = decide_look(design, values, [])
    c = look["comparisons"][0]
    assert look["done"] and c["verdict"] == "not resolved" and c["seeds_needed"] > 3
    text = sentence(c, design, [look], "final val/acc")
    assert text.startswith("a vs b: +0.007 [") and "not resolved with 3 seeds per arm (--max-seeds 3)" in text
    assert f"needs {c['seeds_needed']} seeds per arm" in text


def test_the_looks_file_name_is_one_across_layers():
    from armorlab.analysis.until_resolved_report import LOOKS_FILE

    assert LOOKS_FILE == LOOKS


# --------------------------------------------------------------------------- a decision, without processes
def _complete(chain: Chain, runs, level_of, n_eval=None) -> None:
    """Write each run's dir as a finished trainer would: flat val/acc (and val/n), completed."""
    for r in runs:
        rd = RunDir.create(chain.sweep_dir, r.config)
        if rd.read_status()["state"] == "completed":
            continue
        v = level_of(r.view)
        for step in range(4):
            rd.append_metrics(step, {"val/acc": v, **({"val/n": n_eval} if n_eval else {})})
        rd.write_status("running")
        rd.write_status("completed")


def test_the_margin_is_fixed_before_the_first_look_with_its_source_and_never_made_up(tmp_path):
    declared = _chain(_flat_spec(tmp_path, "declared"), tmp_path / "runs")
    declared.begin()   # looks.json holds the margin and where it comes from before anything ran
    record = json.loads((declared.sweep_dir / LOOKS).read_text())
    assert record["design"]["delta"] == 0.05 and record["looks"] == []
    assert record["chain"]["margin"] == {"delta": 0.05, "source": f"declared: compare.delta in {tmp_path / 'declared.yaml'}"}
    spec = _flat_spec(tmp_path)
    raw = _load_yaml(spec)
    raw["compare"]["delta"] = None
    spec = write_spec(spec, raw)
    chain = _chain(spec, tmp_path / "runs")
    assert math.isnan(chain.design.delta)

    def level_of(cfg):
        return val_level(cfg["seed"], *LEVELS[cfg["objective"]])

    chain.begin()
    st = chain.stand()
    _complete(chain, st.plan.runs, level_of, n_eval=400)
    st = chain.stand()
    assert st.ready
    look = chain.decide(st, by="test")
    record = json.loads((chain.sweep_dir / LOOKS).read_text())
    # no margin declared: none is derived from val/n at the look, and nothing is equivalent
    assert record["design"]["delta"] is None and look["by"] == "test"
    assert record["chain"]["margin"] == {"delta": None, "source": "no margin declared: no equivalence verdict "
                                                                   "(set compare.delta)"}
    assert all(c["verdict"] != "equivalent" for c in look["comparisons"])
    # every val curve is flat: the baseline did not fall in any of its 3 seeds (margins F1)
    assert look["prevention"] == {"baseline": "objective=dapo", "collapsed": 0, "n": 3, "curve_alpha": 0.04,
                                  "p": 1.0, "fell": False}
    design, looks = chain.design, record["looks"]
    for c in look["comparisons"]:
        assert sentence(c, design, looks, "final val/acc").endswith(
            "objective=dapo did not fall here (0 of 3 seeds collapsed): this cannot show prevention")
    assert chain.decide(st, by="again") is None  # that look is recorded: a stale standing decides nothing
    # a margin declared after the first look is refused: it would be chosen knowing the data
    raw["compare"]["delta"] = 0.05
    write_spec(spec, raw)
    with pytest.raises(ArmorLabError, match="looks.json fixes no margin after 1 look") as err:
        _chain(spec, tmp_path / "runs")
    assert err.value.key == "compare.delta" and err.value.value == 0.05
    # a completed run without the endpoint stops the chain, naming it
    fresh = _chain(_flat_spec(tmp_path, "empty"), tmp_path / "runs")
    fresh.begin()
    st = fresh.stand()
    for r in st.plan.runs:
        rd = RunDir.create(fresh.sweep_dir, r.config)
        rd.write_status("running")
        rd.write_status("completed")
    from armorlab.sweeps.until_resolved import advance

    st = advance(fresh, by="test")
    assert st.stopped and "completed without a value of final" in st.stopped and st.plan.runs[0].run_id in st.stopped
