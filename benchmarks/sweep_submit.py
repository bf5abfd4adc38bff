"""Sweep submission speed on the local Slurm cluster (slurm/local/start.sh), as ratios against
peers measured side by side in the same run (absolute seconds do not carry between machines):

* ``submit_ratio`` = a fresh `armorlab sweep` process submitting a 1,000-run grid (spec expand,
  run dirs, submitit pickles, one sbatch per array, manifest)
  / (raw submitit ``map_array`` of 1,000 trivial jobs in-process + `armorlab --help`).
  Target ≤ 1.5.
* ``dry_run_ratio`` = `armorlab sweep --dry-run` of the same grid / `armorlab --help`. Target ≤ 2.
* ``help_ratio`` = `armorlab --help` / ``python -c 'import typer, rich'``. Target ≤ 2.

Every submitted job is harmless and short-lived: `armorlab sweep` jobs run ``true`` instead of a
trainer (ARMORLAB_TRAIN_COMMAND) and the raw submitit jobs run ``abs(i)``; each array is
cancelled (scancel) as soon as it has been timed, and again in a ``finally`` if anything fails.
armorlab's modules are byte-compiled first (``compileall``, into their ``__pycache__``), as an
installed package is: with PYTHONDONTWRITEBYTECODE set (as on CI) every `armorlab` process would
otherwise compile its sources at start-up, a cost no user pays and the peers (typer, rich,
submitit: compiled at install) do not pay either.
Each measurement is taken ``--repeats`` times in alternating order (the three that queue no job —
dry run, `--help`, the typer+rich import — ``--local-repeats`` times: they cost the cluster nothing,
and their ratios move by ±0.2 between single runs); the best of each is used
(the machine is shared: the minimum is the least disturbed). The same ratios by CPU time (user +
sys, child processes included: sbatch, scontrol) are printed too (``*_cpu_ratio``): on a loaded
machine they say what the work costs, the wall-time ratios what a user waits. Output: ``name=value`` lines,
``#`` lines are comments, the last line is ``submit_ratio``.

    eval "$(slurm/local/start.sh)"; .venv/bin/python benchmarks/sweep_submit.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

DEFAULT_CONF = Path(os.environ.get("ARMORLAB_SLURM_DIR", "/tmp/armorlab-slurm")) / "etc" / "slurm.conf"
N_RUNS = 1000


CPU: dict[str, list[float]] = {}  # CPU seconds (user + sys, children included) per measurement


def cpu_now() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    return elapsed, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2, help="of the measurements that queue jobs (1 or 2 "
                    "on a shared cluster: each leaves 1,000 job records for MinJobAge)")
    ap.add_argument("--local-repeats", type=int, default=6, help="of those that queue none")
    args = ap.parse_args()

    import compileall

    import submitit

    import armorlab
    from armorlab.sweeps import slurmctl
    from armorlab.sweeps.manifest import load_manifest
    from armorlab.sweeps.profile import load_profile

    if not os.environ.get("SLURM_CONF") and DEFAULT_CONF.is_file():
        os.environ["SLURM_CONF"] = str(DEFAULT_CONF)
    if not slurmctl.reachable():
        print("# no Slurm cluster reachable: this benchmark submits to the local one-node cluster.\n"
              "# Start it (as root) with:  eval \"$(slurm/local/start.sh)\"  and run again.")
        print("submit_ratio=nan")
        return

    compileall.compile_dir(Path(armorlab.__file__).parent, quiet=1)  # see the module docstring
    work = Path(tempfile.mkdtemp(prefix="armorlab-bench-"))
    queued: list[str] = []  # every array id submitted, cancelled again in `finally`
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
        params = load_profile(profile).submitit_parameters(job_name="bench-raw")

        # a shim that counts sbatch calls, then runs the real one
        shim = work / "bin"
        shim.mkdir()
        counter = work / "sbatch_calls"
        real = shutil.which("sbatch")
        (shim / "sbatch").write_text(f"#!/bin/sh\necho x >> '{counter}'\nexec '{real}' \"$@\"\n")
        (shim / "sbatch").chmod(0o755)
        env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}",
               "ARMORLAB_TRAIN_COMMAND": json.dumps(["true"])}  # jobs that exit at once
        cli = [sys.executable, "-m", "armorlab.cli"]

        def raw_map_array(i: int) -> float:
            ex = submitit.SlurmExecutor(folder=work / f"raw{i}")
            ex.update_parameters(**params)
            t0 = time.perf_counter()
            jobs = ex.map_array(abs, range(N_RUNS))
            elapsed = time.perf_counter() - t0
            arrays = sorted({j.job_id.split("_", 1)[0] for j in jobs})
            queued.extend(arrays)
            slurmctl.scancel(arrays)
            return elapsed

        # map_array in a fresh process, submitit's import included: what `sweep` would add through it
        fresh_script = ("import json, sys, submitit\n"
                        "ex = submitit.SlurmExecutor(folder=sys.argv[1])\n"
                        "ex.update_parameters(**json.loads(sys.argv[2]))\n"
                        "print(' '.join(sorted({j.job_id.split('_', 1)[0] for j in ex.map_array(abs, range(int(sys.argv[3])))})))")

        def fresh_map_array(i: int) -> float:
            elapsed, out = timed([sys.executable, "-c", fresh_script, str(work / f"fresh{i}"), json.dumps(params),
                                  str(N_RUNS)], env)
            arrays = out.stdout.split()
            queued.extend(arrays)
            slurmctl.scancel(arrays)
            return elapsed

        def sweep_submit(i: int) -> float:
            root = work / f"runs{i}"
            calls_before = len(counter.read_text().splitlines()) if counter.exists() else 0
            elapsed, _ = timed([*cli, "sweep", str(spec), "--root", str(root), "--profile", str(profile)], env)
            manifest = load_manifest(root / "bench")
            arrays = sorted({j for s in manifest.submissions for j in s["slurm_job_ids"]})
            queued.extend(arrays)
            slurmctl.scancel(arrays)
            n_jobs = sum(len(v) for v in manifest.jobs.values())
            if n_jobs != N_RUNS:
                sys.exit(f"expected {N_RUNS} queued runs, the manifest has {n_jobs}")
            stats["sbatch_calls"] = len(counter.read_text().splitlines()) - calls_before
            stats["arrays"] = len(arrays)
            return elapsed

        dry_root = work / "dry"
        measures = {
            "raw_map_array_s": raw_map_array,
            "fresh_map_array_s": fresh_map_array,
            "python_s": lambda i: timed([sys.executable, "-c", "pass"], env)[0],
            "submit_s": sweep_submit,
            "dry_run_s": lambda i: timed([*cli, "sweep", str(spec), "--root", str(dry_root), "--profile",
                                          str(profile), "--dry-run"], env)[0],
            "help_s": lambda i: timed([*cli, "--help"], env)[0],
            "import_typer_rich_s": lambda i: timed([sys.executable, "-c", "import typer, rich"], env)[0],
        }
        stats: dict[str, int] = {}
        samples: dict[str, list[float]] = {k: [] for k in measures}
        queueing = {"raw_map_array_s", "fresh_map_array_s", "submit_s"}
        for i in range(max(args.repeats, args.local_repeats)):
            names = [n for n in measures if i < (args.repeats if n in queueing else args.local_repeats)]
            for name in names[i % len(names):] + names[:i % len(names)]:  # rotate who goes first
                c0 = cpu_now()
                samples[name].append(measures[name](i))
                CPU.setdefault(name, []).append(cpu_now() - c0)
        best = {k: min(v) for k, v in samples.items()}

        print(f"# {N_RUNS} runs, best of {args.repeats} alternating repeats ({args.local_repeats} of those "
              f"that queue no job); load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; cluster MaxArraySize "
              f"{slurmctl.max_array_size()}")
        print(f"runs={N_RUNS}")
        print(f"arrays={stats['arrays']}")
        print(f"sbatch_calls={stats['sbatch_calls']}")
        for name, value in best.items():
            print(f"{name}={value:.3f}")
        cpu = {k: min(v) for k, v in CPU.items()}
        for name, value in cpu.items():  # what the work costs, whatever else the machine runs
            print(f"{name.removesuffix('_s')}_cpu_s={value:.3f}")
        print(f"help_cpu_ratio={cpu['help_s'] / cpu['import_typer_rich_s']:.2f}")
        print(f"dry_run_cpu_ratio={cpu['dry_run_s'] / cpu['help_s']:.2f}")
        print(f"submit_cpu_ratio={cpu['submit_s'] / (cpu['raw_map_array_s'] + cpu['help_s']):.2f}")
        print(f"help_ratio={best['help_s'] / best['import_typer_rich_s']:.2f}")
        print(f"dry_run_ratio={best['dry_run_s'] / best['help_s']:.2f}")
        print(f"submit_ratio={best['submit_s'] / (best['raw_map_array_s'] + best['help_s']):.2f}")
        # the hand-written array submission against submitit's map_array (library_replacements.py):
        # `sweep` through map_array would pay at least the plan (the dry run: start-up, spec, ids,
        # script) plus a fresh process's import of submitit and map_array of as many tasks, less
        # that process's interpreter start-up (the dry run paid it); the floor leaves out pickling
        # TrainJobs (map_array here pickles abs) and the manifest
        for key, b in (("", best), ("cpu_", cpu)):
            floor = b["dry_run_s"] + b["fresh_map_array_s"] - b["python_s"]
            print(f"submit_by_map_array_floor_{key}s={floor:.3f}")
            print(f"array_submission_{key}gain={1 - b['submit_s'] / floor:.2f}")
    finally:
        if queued:
            subprocess.run(["scancel", *queued], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
