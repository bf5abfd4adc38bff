"""``python -m armorlab``: the same command as ``armorlab`` (what torchrun and accelerate launch run)."""

from armorlab.cli import run

run()
