"""Decisions on curves and seeds (numpy/scipy, no I/O but collapse's cached null thresholds), used by
train, sweeps, tune and the report alike: collapse, select, seeds, verdicts, margins, sequential (seeds
until resolved: the loop is armorlab.sweeps.until_resolved, its report analysis.until_resolved_report)."""
