"""Decisions on curves and seeds (no I/O but collapse's cached null thresholds) for train, sweeps, tune
and the report; seeds until resolved: sequential (loop: sweeps.until_resolved, report: its analysis)."""
