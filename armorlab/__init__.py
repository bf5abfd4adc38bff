"""armorlab: ablations for ARMOR and UP policy objectives in LLM RL with verifiable rewards."""

__version__ = "0.1.0"
