"""What the fast submit path (issue 14) must not change silently.

* ``--dry-run`` renders the sbatch script without submitit (sbatch.render_script): it must be the
  text submitit writes, byte for byte, for any profile (hypothesis); the end-to-end equality with
  the script a real submission queued is in test_sweep_slurm.py.
* A fresh Slurm run's dir is written by its job from the config the job carries (TrainJob.config):
  the same files, the same id, whatever the values; pickles without a config still load.
* The manifest's text (one top-level key per line) and the run config's YAML (libyaml, entries
  cached) read back as the data written, for hostile values too.
"""

from __future__ import annotations

import json
import os
import pickle
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sweep_support import standin_command, write_spec

from armorlab.core.config import resolve
from armorlab.core.fsutil import yaml_text
from armorlab.core.runs import RunDir, run_id
from armorlab.sweeps.executors import SlurmSubmitter
from armorlab.sweeps.jobs import ENV_COMMAND, TrainJob
from armorlab.sweeps.manifest import manifest_text
from armorlab.sweeps.profile import parse_profile
from armorlab.sweeps.sbatch import render_script
from armorlab.sweeps.submit import plan_sweep, prepare

pytest.importorskip("submitit")

# printable, no control characters (a profile refuses those), shell metacharacters welcome
WORDS = st.text(alphabet=string.ascii_letters + string.digits + " $`'\"\\;&|()<>*?!#%=,.:-_/~{}[]é",
                min_size=1, max_size=12)
OPTION = st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True)
PROFILES = st.fixed_dictionaries({}, optional={
    "partition": WORDS, "account": WORDS, "qos": WORDS, "python": WORDS,
    "nodes": st.integers(1, 64), "gpus_per_node": st.integers(0, 8), "cpus_per_task": st.integers(1, 256),
    "mem_gb": st.one_of(st.integers(1, 4096), st.floats(0.01, 4096, allow_nan=False)),
    "time_min": st.integers(1, 10**5), "array_parallelism": st.integers(1, 5000),
    "signal_delay_s": st.integers(1, 3600), "setup": st.lists(WORDS, max_size=3),
    "sbatch": st.dictionaries(OPTION, st.one_of(WORDS, st.integers(-5, 10**6), st.booleans(),
                                                st.floats(-1e6, 1e6, allow_nan=False)), max_size=4),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=PROFILES, n_runs=st.integers(1, 3000), folder=WORDS, name=WORDS)
def test_dry_run_script_is_submitits_script(data, n_runs, folder, name, tmp_path):
    sub = SlurmSubmitter(tmp_path / folder / "sweep", parse_profile(data), job_name=name)
    ours = sub._rendered(n_runs)
    assert ours is not None  # every parameter a profile produces is modelled
    assert ours == sub._submitit_text(sub._executor(dry_run=True), n_runs)
    assert sub.sbatch_text(n_runs) == ours


def test_an_unmodelled_parameter_asks_submitit(tmp_path):
    assert render_script(tmp_path, {"job_name": "s", "teardown": ["echo bye"]}) is None


# --------------------------------------------------------------------------- run dirs written by the job
def _standin(monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, standin_command())
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", "0")


def test_a_job_writes_its_run_dir_from_the_config_it_carries(tmp_path, monkeypatch):
    _standin(monkeypatch)
    cfg = resolve({"max_steps": 2, "seed": 3, "hub_model_id": "x'\n$(touch PWNED)"})
    run_dir = tmp_path / "sweep" / run_id(cfg)
    job = pickle.loads(pickle.dumps(TrainJob(run_dir, config=cfg)))  # as the Slurm task unpickles it
    assert job.config == cfg and not run_dir.exists()
    outcome = job.run()
    assert (outcome.returncode, outcome.state) == (0, "completed")
    assert RunDir(run_dir).read_config() == cfg
    assert not (tmp_path / "PWNED").exists()
    # a duplicate start of the same job finds the run completed and changes nothing
    assert pickle.loads(pickle.dumps(TrainJob(run_dir, config=cfg))).run().state == "completed"
    # its requeue carries the path only; a pickle of an armorlab without configs still loads
    assert "config" not in TrainJob(run_dir).__getstate__()
    legacy = TrainJob.__new__(TrainJob)
    legacy.__setstate__({"run_dir": str(run_dir), "launcher": "python", "accelerate_config": None})
    assert legacy.config is None and legacy.run().state == "completed"


def test_a_job_refuses_a_config_that_is_not_its_run_dirs(tmp_path, monkeypatch):
    _standin(monkeypatch)
    a, b = resolve({"seed": 1}), resolve({"seed": 2})
    with pytest.raises(RuntimeError, match="carries the config of run"):
        TrainJob(tmp_path / run_id(a), config=b).run()


def test_slurm_prepare_leaves_fresh_run_dirs_to_the_jobs(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", {"name": "s", "base": {"max_steps": 2}, "grid": {"seed": [0, 1, 2]}})
    plan = plan_sweep(spec, root=tmp_path / "runs")
    torn = plan.sweep_dir / plan.runs[1].run_id  # a dir a crash left half-written (older armorlab)
    torn.mkdir(parents=True)
    (torn / "config.yaml").write_text("objective: da")
    manifest, todo = prepare(plan, defer_new=True)
    assert todo == [(str(plan.sweep_dir.absolute() / r.run_id), None if r is plan.runs[1] else r.config)
                    for r in plan.runs]
    assert sorted(p.name for p in plan.sweep_dir.iterdir() if not p.name.startswith(".")) == sorted(
        ["spec.yaml", "sweep.json", torn.name])
    assert RunDir(torn).read_config() == plan.runs[1].config  # the torn one rewritten, as before
    assert manifest.runs == [r.run_id for r in plan.runs]


# --------------------------------------------------------------------------- texts that must read back
HOSTILE = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["null", "~", "yes", "no", "on", "true", "1e3", "0x1F", "010", ": x", "- x", "#x", "'", '"',
                     " lead", "trail ", "a\nb", "\t", "\u2028", "\x85", "é\u00a0", "---", "...", "&a", "*a", "!x",
                     "%x", "@x", "`x", "{a: 1}", "[1]", "", " ", "x" * 200]),
    st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.none())
DATA = st.recursive(HOSTILE, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=12), DATA, max_size=8))
def test_config_yaml_reads_back_and_its_entry_cache_changes_nothing(cfg):
    text = yaml_text(cfg)
    assert yaml.safe_load(text) == cfg
    # entry by entry (cached) is the whole mapping in one dump, by the same (libyaml's) emitter
    whole = yaml.dump(cfg, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=True,
                      default_flow_style=False)
    assert text == whole
    assert yaml_text(cfg) == text  # the second time from the entry cache


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=12), DATA, max_size=8))
def test_manifest_text_reads_back(data):
    assert json.loads(manifest_text(data)) == data


def test_config_yaml_of_real_configs_round_trips(tmp_path):
    cfg = resolve({"objective": "armor", "alpha": 0.7, "seed": 5, "hub_model_id": "a: b\n- c # d",
                   "run_name": "é\u2028'\""})
    rd = RunDir.create(Path(tmp_path), cfg)
    assert rd.read_config() == cfg and run_id(rd.read_config()) == rd.id


def _containers(obj, out=None):
    out = [] if out is None else out
    if isinstance(obj, (dict, list)):
        out.append(obj)
        for v in obj.values() if isinstance(obj, dict) else obj:
            _containers(v, out)
    return out


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.dictionaries(st.text(max_size=8), DATA, max_size=6), DATA))
def test_each_seeds_config_is_its_own_deep_copy(data):
    from armorlab.sweeps.spec import _copier

    make = _copier(data)
    a, b = make(), make()
    assert a == data and b == data
    if isinstance(data, dict):
        assert list(a) == list(data)  # key order kept
    shared = {id(c) for c in _containers(data)}
    assert not shared & {id(c) for c in _containers(a)} and not {id(c) for c in _containers(a)} & {
        id(c) for c in _containers(b)}


def test_each_plans_config_is_its_points_resolved_config_and_its_own(tmp_path):
    import copy

    from armorlab.core.config import set_dotted
    from armorlab.sweeps.spec import expand, load_spec

    spec = load_spec(write_spec(tmp_path / "s.yaml", {
        "name": "s", "base": {"objective": "armor", "max_steps": 3, "task": {"name": "arithmetic", "digits": 1}},
        "grid": {"alpha": [0.9, 0.7], "task.digits": [1, 2]}, "seeds": [0, 1, 2],
        "exclude": [{"alpha": 0.7, "seed": 1}], "include": [{"objective": "dapo"}]}))
    plans = expand(spec)
    assert len(plans) == (4 + 1) * 3 - 2  # the excluded point's two digit settings
    views = [dict(plan.view) for plan in plans]  # read before any config is made
    for plan, view in zip(plans, views, strict=True):
        assert view == plan.config
        raw = copy.deepcopy(spec.base)  # the config resolved the plain way: base, then the point's keys
        for key, value in plan.point.items():
            set_dotted(raw, key, value, file="x")
        assert plan.config == resolve(raw) and run_id(plan.config) == plan.run_id
    plans[0].config["task"]["digits"] = 99  # a plan's config shares nothing with another's
    plans[0].config["alpha"] = 0.1
    assert all(p.config["task"]["digits"] in (1, 2) and p.config["alpha"] != 0.1 for p in plans[1:])


# --------------------------------------------------------------------------- one file per job array
def _delayed(job, countdown=3):
    from submitit.core.utils import DelayedSubmission

    d = DelayedSubmission(job)
    d.set_timeout(20, countdown)
    return d


def test_a_task_writes_submitits_own_pickle_from_the_array_file_and_never_replaces_one(tmp_path, monkeypatch):
    import cloudpickle

    from armorlab.sweeps.array_task import array_bytes, materialise, read_entries, task_entry

    folder = tmp_path / ".submitit"
    folder.mkdir()
    jobs = [TrainJob(tmp_path / f"r{i}", config={"seed": i}) for i in range(3)]
    entries = [task_entry(j, 20, 3) for j in jobs]
    (folder / "41_array.pkl").write_bytes(array_bytes(entries))
    assert read_entries(folder / "41_array.pkl") == entries
    # a first start writes submitit's <A>_<a>_submitted.pkl: the bytes submitit's array submission
    # writes for the task (its DelayedSubmission with set_timeout(time limit, requeues left))
    assert materialise(folder, "41", 2) == folder / "41_2_submitted.pkl"
    _delayed(jobs[2]).dump(tmp_path / "submitits.pkl")
    assert (folder / "41_2_submitted.pkl").read_bytes() == (tmp_path / "submitits.pkl").read_bytes()
    # a requeued start finds submitit's checkpoint (no config: TrainJob.checkpoint) and keeps it
    checkpointed = cloudpickle.dumps(_delayed(TrainJob(tmp_path / "r1"), countdown=2), pickle.HIGHEST_PROTOCOL)
    (folder / "41_1_submitted.pkl").write_bytes(checkpointed)
    materialise(folder, "41", 1)
    assert (folder / "41_1_submitted.pkl").read_bytes() == checkpointed
    # ... also when the check and the write race (another task of the job wrote it meanwhile)
    (folder / "41_0_submitted.pkl").write_bytes(checkpointed)
    monkeypatch.setattr(Path, "exists", lambda self: self.name == "41_array.pkl")
    materialise(folder, "41", 0)
    assert (folder / "41_0_submitted.pkl").read_bytes() == checkpointed
    assert sorted(p.name for p in folder.iterdir()) == ["41_0_submitted.pkl", "41_1_submitted.pkl",
                                                        "41_2_submitted.pkl", "41_array.pkl"]  # no temp left
    with pytest.raises(RuntimeError, match="waited 0 s"):  # an array whose sweep died before publishing it
        materialise(folder, "42", 0, wait_s=0)


def test_recovery_finds_arrays_and_older_per_task_pickles(tmp_path):
    from armorlab.sweeps.array_task import array_bytes, task_entry
    from armorlab.sweeps.manifest import Manifest
    from armorlab.sweeps.submit import recover_submitted

    sweep = tmp_path / "sweep"
    folder = sweep / ".submitit"
    folder.mkdir(parents=True)
    runs = [f"run{i}" for i in range(6)]
    m = Manifest(sweep_dir=sweep, name="s", runs=runs)
    m.record("slurm", ["run5"], ["7_0"])
    m.begin(runs[:5])

    def entry(rid):
        return task_entry(TrainJob(sweep / rid), 5, 3)

    (folder / "7_array.pkl").write_bytes(array_bytes([entry("run5"), entry("run0")]))  # 7_0 is known
    (folder / "unqueued-ab12_array.pkl").write_bytes(array_bytes([entry("run4")]))  # sbatch never answered
    (folder / "9_array.pkl").write_bytes(array_bytes([entry("run1"), entry("run2")]))
    _delayed(TrainJob(sweep / "run3")).dump(folder / "5_2_submitted.pkl")  # an earlier armorlab's array
    _delayed(TrainJob(tmp_path / "elsewhere" / "run4")).dump(folder / "6_submitted.pkl")  # not this sweep's
    (folder / "8_array.pkl").write_bytes(b"torn")
    assert recover_submitted(m) == 4
    assert {r: m.last_job(r) for r in runs} == {"run0": "7_1", "run1": "9_0", "run2": "9_1", "run3": "5_2",
                                                "run4": None, "run5": "7_0"}
    assert m.pending == [] and not (folder / "unqueued-ab12_array.pkl").exists()


def _fake_slurm(tmp_path, monkeypatch, sbatch_body):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", "exit 0"), ("sbatch", sbatch_body)):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_an_array_submission_queues_one_file_and_the_script_the_dry_run_shows(tmp_path, monkeypatch, caplog):
    from armorlab.sweeps import executors
    from armorlab.sweeps.array_task import read_entries

    _fake_slurm(tmp_path, monkeypatch, 'echo "Submitted batch job 4242"')
    sub = SlurmSubmitter(tmp_path / "sweep", parse_profile({"time_min": 7, "max_num_timeout": 5}), job_name="s")
    runs = [str(tmp_path / "sweep" / f"r{i}") for i in range(3)]
    seen = []
    ids = sub.submit(runs, chunk=10, before_array=seen.append, on_array=lambda r, j: seen.append((r, j)))
    assert ids == ["4242_0", "4242_1", "4242_2"] and seen == [["r0", "r1", "r2"], (["r0", "r1", "r2"], ids)]
    folder = tmp_path / "sweep" / ".submitit"
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["4242_array.pkl",
                                                                                    "4242_submission.sh"]
    # submitit's layout: the script's first name is a link to <A>_submission.sh
    (first,) = [p for p in folder.iterdir() if p.name.startswith(".submission_file_")]
    assert first.is_symlink() and first.resolve() == folder / "4242_submission.sh"
    tasks = [pickle.loads(e) for e in read_entries(folder / "4242_array.pkl")]
    assert [(t[0].run_dir, t[1], t[2]) for t in tasks] == [(r, 7, 5) for r in runs]
    script = (folder / "4242_submission.sh").read_text()
    assert script == sub.sbatch_text(3) and "-m armorlab.sweeps.array_task" in script
    assert "different sbatch script" not in caplog.text
    # a single run goes through submitit, whose script is checked against the dry run's: an
    # upgraded submitit that writes another one is said before sbatch
    monkeypatch.setattr(executors, "render_script", lambda *a, **kw: "#!/bin/bash\n")
    assert sub.submit(runs[:1], chunk=10, on_array=lambda r, j: None) == ["4242"]
    assert "`armorlab sweep --dry-run` shows a different sbatch script" in caplog.text


SUBMIT_WITHOUT_SUBMITIT = """
import sys
from armorlab.sweeps.executors import SlurmSubmitter
from armorlab.sweeps.profile import parse_profile
sub = SlurmSubmitter(sys.argv[1], parse_profile({}), job_name="s")
ids = sub.submit([sys.argv[1] + f"/r{i}" for i in range(4)], chunk=10, on_array=lambda r, j: None)
print(ids[-1], "submitit" in sys.modules)
"""


def test_an_array_is_queued_without_importing_submitit(tmp_path, monkeypatch):
    """submitit's import (asyncio, ssl, importlib.metadata) cost a 1,000-run submit more than
    its pickles: an array's tasks are made into submitit's DelayedSubmissions on the node."""
    import subprocess
    import sys

    _fake_slurm(tmp_path, monkeypatch, 'echo "Submitted batch job 77"')
    out = subprocess.run([sys.executable, "-c", SUBMIT_WITHOUT_SUBMITIT, str(tmp_path / "sweep")],
                         capture_output=True, text=True)
    assert out.stdout.split() == ["77_3", "False"], out.stdout + out.stderr


def test_sbatch_refusing_an_array_is_a_clear_error_and_leaves_no_array_file(tmp_path, monkeypatch):
    from armorlab.errors import ArmorLabError

    _fake_slurm(tmp_path, monkeypatch, 'echo "sbatch: error: invalid partition" >&2; exit 1')
    sub = SlurmSubmitter(tmp_path / "sweep", parse_profile({}), job_name="s")
    with pytest.raises(ArmorLabError, match="sbatch refused the job array: .*invalid partition"):
        sub.submit([str(tmp_path / "r0"), str(tmp_path / "r1")], chunk=10, on_array=lambda r, j: None)
    assert not list((tmp_path / "sweep" / ".submitit").iterdir())  # no array file, no script left
