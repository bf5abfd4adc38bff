"""Reports over run directories in stages (armorlab.analysis.report, docs/design.md), capacity statistics
and importers of other libraries' logs; never imports torch or the trainer; submodules import lazily."""
