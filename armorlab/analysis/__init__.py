"""Analysis of run directories: KL, probability capacity, collapse metrics, reports. The decisions on
curves and seeds (collapse, selection, seed statistics, verdicts, the sequential design) are
armorlab.stats's.

Pure numpy/pandas (plus matplotlib for plots); it never imports torch or the trainer and meets
training only through run directories (armorlab.core.runs). Importing this package is cheap: each
submodule imports what it needs.

    load       run dirs → long/wide DataFrames (vectorised parse, Arrow IPC cache); other libraries'
               runs through importers
    importers  TRL, W&B, TensorBoard, verl, trackio (and OpenRLHF through W&B/TensorBoard) logs →
               armorlab's metric names, read-only
    kl         Schulman's k1/k2/k3 estimators (both directions) and exact categorical KL
    capacity_stats  probability-capacity statistics of tokens/ samples (formulas: armorlab.algos.capacity)
    verdict_table  the report's verdict table (first on the page)
    mechanism_table  did each remedy's mechanism act (one row per group)
    until_resolved_report, until_resolved_scores  a sweep run until resolved: its looks in the report,
               and the endpoint scores each look decides on
    value_labels  config values as the report shows them (no pandas)
    recipe     report recipes (analysis/*.yaml)
    tables, plots, html, report   the `armorlab report` outputs
"""
