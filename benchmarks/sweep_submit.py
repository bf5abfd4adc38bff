"""Sweep submission speed on the local Slurm cluster (slurm/local/start.sh).

Expands a 1,000-run grid, times `armorlab sweep --dry-run` (a fresh process, as a user runs it),
then submits it to the cluster as job arrays whose jobs exit at once, and counts the sbatch calls
(through a counting shim in front of the real sbatch). Targets: dry-run ≤ 1 s, submit ≤ 5 s.
The submitted jobs are cancelled afterwards. Last line: ``submit_s=<seconds>``.

    eval "$(slurm/local/start.sh)"; .venv/bin/python benchmarks/sweep_submit.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

DRY_RUN_TARGET_S, SUBMIT_TARGET_S = 1.0, 5.0
DEFAULT_CONF = Path(os.environ.get("ARMORLAB_SLURM_DIR", "/tmp/armorlab-slurm")) / "etc" / "slurm.conf"


def cli(*args: str, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "armorlab.cli", *args], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"armorlab {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return elapsed, out


def main() -> None:
    from armorlab.sweeps import slurmctl
    from armorlab.sweeps.manifest import load_manifest
    from armorlab.sweeps.spec import expand, load_spec

    if not os.environ.get("SLURM_CONF") and DEFAULT_CONF.is_file():
        os.environ["SLURM_CONF"] = str(DEFAULT_CONF)
    if not slurmctl.reachable():
        print("no Slurm cluster reachable: this benchmark submits to the local one-node cluster.\n"
              "Start it (as root) with:  eval \"$(slurm/local/start.sh)\"  and run again.")
        print("submit_s=nan")
        return

    work = Path(tempfile.mkdtemp(prefix="armorlab-bench-"))
    try:
        spec = work / "bench.yaml"
        spec.write_text(yaml.safe_dump({
            "name": "bench",
            "base": {"objective": "dapo", "max_steps": 1},
            "grid": {"learning_rate": [round(1e-4 * (i + 1), 6) for i in range(10)],
                     "epsilon_high": [round(0.21 + 0.01 * i, 2) for i in range(10)]},
            "seeds": list(range(10)),
        }))
        profile = work / "profile.yaml"
        profile.write_text("executor: slurm\ncpus_per_task: 1\ntime_min: 5\narray_parallelism: 4\n")

        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            plans = expand(load_spec(spec))
            times.append(time.perf_counter() - t0)
        expand_s = statistics.median(times)
        assert len(plans) == 1000, len(plans)

        # a shim that counts sbatch calls, then runs the real one
        shim = work / "bin"
        shim.mkdir()
        counter = work / "sbatch_calls"
        real = shutil.which("sbatch")
        (shim / "sbatch").write_text(f"#!/bin/sh\necho x >> '{counter}'\nexec '{real}' \"$@\"\n")
        (shim / "sbatch").chmod(0o755)
        env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}",
               "ARMORLAB_TRAIN_COMMAND": json.dumps(["true"])}  # jobs that exit at once

        root = work / "runs"
        dry = [cli("sweep", str(spec), "--root", str(root), "--profile", str(profile), "--dry-run", env=env)[0]
               for _ in range(3)]
        dry_run_s = statistics.median(dry)
        startup_s = statistics.median(cli("--help", env=env)[0] for _ in range(3))
        calls_before = len(counter.read_text().splitlines()) if counter.exists() else 0
        submit_s, out = cli("sweep", str(spec), "--root", str(root), "--profile", str(profile), env=env)
        sbatch_calls = len(counter.read_text().splitlines()) - calls_before
        manifest = load_manifest(root / "bench")
        arrays = sorted({j for s in manifest.submissions for j in s["slurm_job_ids"]})
        slurmctl.scancel(arrays)
        n_jobs = sum(len(v) for v in manifest.jobs.values())

        print(f"runs={len(plans)} arrays={len(arrays)} jobs_queued={n_jobs} "
              f"cluster_max_array_size={slurmctl.max_array_size()}")
        print(f"expand_s={expand_s:.3f}  (in-process, median of 3)")
        print(f"dry_run_s={dry_run_s:.3f}  target {DRY_RUN_TARGET_S:.1f}s  ratio={dry_run_s / DRY_RUN_TARGET_S:.2f}"
              "  (fresh `armorlab sweep --dry-run` process, median of 3)")
        print(f"cli_startup_s={startup_s:.3f}  (`armorlab --help`, the floor under both; dry_run/startup="
              f"{dry_run_s / startup_s:.1f}x)")
        print(f"sbatch_calls={sbatch_calls}")
        print(f"submit_ratio={submit_s / SUBMIT_TARGET_S:.2f}  target {SUBMIT_TARGET_S:.1f}s "
              "(fresh `armorlab sweep` process: run dirs + pickles + sbatch + manifest)")
        print(f"submit_s={submit_s:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
