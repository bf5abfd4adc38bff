"""The sweep's control check compares each pair's effective batch (issue 36, item 2): from the
configs in a dry run (rows per step, the groups each arm drops, how far it refills), and from the
measured train/refill_shortfall once runs of both arms have completed — the report's rule and
tolerance (armorlab.stats.effective_batch). Each mismatch is planted; each match must stay silent."""

from __future__ import annotations

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir
from armorlab.stats.effective_batch import EFFECTIVE_BATCH_TOLERANCE
from armorlab.sweeps.controls import configured_batch, configured_batch_note
from tests.sweep_support import run_cli, write_spec

TINY = {"model": "tiny", "task": {"name": "arithmetic", "train_size": 8}, "max_steps": 4}


def _cfg(**keys):
    return resolve({**TINY, **keys})


def test_configured_batch_reads_rows_drops_and_refill():
    dapo = configured_batch(_cfg(objective="dapo", per_device_train_batch_size=16, gradient_accumulation_steps=2,
                                 dynamic_sampling_factor=3, max_num_gen_batches=2))
    assert (dapo.rows, dapo.draws) == (32, 6) and dapo.drops == ("equal-reward groups",)
    grpo = configured_batch(_cfg(objective="grpo", dynamic_sampling_factor=3, max_num_gen_batches=2))
    assert grpo.drops == () and grpo.draws == 1  # drops nothing: nothing to refill
    gate = configured_batch(_cfg(objective="armor", anchor=True, anchor_gate=True, dynamic_sampling=True))
    assert gate.drops == ("equal-reward groups (an anchor's spread kept)", "groups the gate fails")


def test_a_planted_mismatch_of_configured_batches_warns_and_a_match_does_not():
    dapo, armor = _cfg(objective="dapo"), _cfg(objective="dapo", anchor=True)
    # DAPO drops all-wrong groups that an anchor keeps, and neither refills: the batches can differ
    note = configured_batch_note(dapo, armor)
    assert note is not None and "drop different groups and one cannot refill" in note
    # both refill up to 3× the prompts: left to the measured check
    assert configured_batch_note(_cfg(objective="dapo", max_num_gen_batches=3),
                                 _cfg(objective="dapo", anchor=True, max_num_gen_batches=3)) is None
    # the same drops refilled to different bounds
    note = configured_batch_note(_cfg(objective="dapo"), _cfg(objective="dapo", max_num_gen_batches=3))
    assert note is not None and "refilled to different bounds" in note
    # rows per step: 20 vs 16 is 20 % apart (> 5 %); 20 vs 21 is 4.8 % (within)
    assert EFFECTIVE_BATCH_TOLERANCE == 0.05
    grpo = {"objective": "grpo", "num_generations": 4}
    assert "rows per step differ" in configured_batch_note(_cfg(**grpo, per_device_train_batch_size=16),
                                                           _cfg(**grpo, per_device_train_batch_size=20))
    assert configured_batch_note(_cfg(**grpo, per_device_train_batch_size=20, gradient_accumulation_steps=1),
                                 _cfg(**grpo, per_device_train_batch_size=21)) is None
    assert configured_batch_note(_cfg(objective="grpo"), _cfg(objective="grpo", beta=0.1)) is None


def _spec(tmp_path, **base):
    raw = {"name": "eb", "base": {**TINY, "objective": "dapo", **base}, "include": [{"anchor": False}, {"anchor": True}],
           "seeds": [0],
           "controls": {"baseline": {"anchor": False}, "arms": [{"name": "anchors", "select": {"anchor": True},
                                                                 "factor": ["anchor"]}]}}
    return write_spec(tmp_path / "eb.yaml", raw)


def test_the_dry_run_warns_on_the_configured_and_on_the_measured_effective_batch(tmp_path):
    from armorlab.sweeps.submit import plan_sweep

    root = tmp_path / "runs"
    out = run_cli("sweep", str(_spec(tmp_path)), "--root", str(root), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "warning: configured effective batch: they drop different groups and one cannot refill" in out.stdout
    # refilled to 3 batches: nothing to say before any run has finished
    spec = _spec(tmp_path, max_num_gen_batches=3)
    out = run_cli("sweep", str(spec), "--root", str(root), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "effective batch" not in out.stdout
    # both arms completed; the anchors arm filled 90 % of its batches, the baseline 70 % + 72 % (two
    # halves of the run): 0.90 vs 0.71, 19 points apart, beyond the 5 % tolerance
    plan = plan_sweep(spec, root=root)
    shortfalls = {False: [0.3, 0.28], True: [0.1, 0.1]}
    for r in plan.runs:
        rd = RunDir.create(plan.sweep_dir, r.config)
        for step, value in enumerate(shortfalls[r.config["anchor"]], start=1):
            rd.append_metrics(step, {"train/refill_shortfall": value})
        rd.write_status("completed")
    out = run_cli("sweep", str(spec), "--root", str(root), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert ("warning: measured effective batch: 90% of the arm's batch trains vs 71% of the baseline's"
            in out.stdout), out.stdout
    # a measured gap within the tolerance (0.90 vs 0.87: the baseline's steps rewritten) is silent
    for r in plan.runs:
        if not r.config["anchor"]:
            for step, value in ((1, 0.12), (2, 0.14)):
                RunDir(plan.sweep_dir / r.run_id).append_metrics(step, {"train/refill_shortfall": value})
    out = run_cli("sweep", str(spec), "--root", str(root), "--dry-run")
    assert "effective batch" not in out.stdout, out.stdout
