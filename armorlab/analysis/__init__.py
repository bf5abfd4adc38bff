"""Reports over run directories, built in stages (load → group → score → decide → draw → tables →
page: armorlab.analysis.report, docs/design.md), capacity statistics of tokens/ samples, and
importers of other libraries' logs. The decisions on curves and seeds are armorlab.stats's.

Pure numpy/pandas (plus matplotlib for plots): it never imports torch or the trainer and meets
training only through run directories. Importing this package is cheap: each submodule imports
what it needs.
"""
