"""Sweeps: ablation grids → run directories → jobs (local worker processes or Slurm job arrays).

Torch-free by design: a job meets training only through its run directory, by running
``python -m armorlab.cli train --run-dir DIR`` (see jobs.py).

    spec.py       sweep spec (YAML) → validated SweepSpec → expanded RunPlans (dedup, stable order)
    profile.py    cluster profiles (slurm/*.yaml) → submitit parameters
    jobs.py       TrainJob: the picklable, checkpointable callable a job runs
    slurmctl.py   thin wrappers over scontrol / squeue / sacct / scancel
    manifest.py   the sweep dir's manifest (atomic JSON): spec copy, run ids, job ids
    executors.py  local (worker pool) and slurm (submitit arrays) executors
    submit.py     plan → what still needs submitting → submit → manifest
    status.py     per-run state for `armorlab status`, and cancel
    seed_copies.py  each seed's copy of a resolved point and its run id, fast (1,000-run dry runs)
    until_resolved.py  seeds until resolved, the loop: looks, the Slurm decision job
    until_resolved_compare.py  the spec's `compare:` (what `--until-resolved` compares)
    until_resolved_looks.py    looks.json and the seeds each look runs
"""
