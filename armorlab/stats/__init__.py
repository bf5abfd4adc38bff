"""Decisions on curves and seeds: pure numpy/scipy, no I/O but the collapse detector's cached null
thresholds. Used during training (kept checkpoints, init_from), sweeps (seeds until resolved),
tuning (pruning) and by the report alike, so none of them stands on the report.

    collapse         peak, drop, collapse step, AUC, divergence, entropy collapse, length blow-up
    select           "best on val, reported on test" and "at matched steps"
    seeds            seed aggregation: mean, std, n, bootstrap CI, IQM, probability of improvement
    verdicts         better / worse / equivalent / not resolved per arm, and the seeds that resolve it
    margins          equivalence margins (declared, never a noise unit) and whether the baseline fell
    sequential       seeds until resolved, the decisions: group-sequential boundaries, decide_look,
                     looks.json (the loop is armorlab.sweeps.until_resolved, its report
                     armorlab.analysis.until_resolved_report)
    sequential_text  the sentences those decisions are printed as
"""
