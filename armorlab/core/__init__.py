"""The torch-free contract every other layer builds on: the config fields and their validation,
the run-directory contract, crash-safe files, exit codes, identities of models and data, health
warnings, TRL's field names and vLLM settings. Imports nothing above ``armorlab.algos``."""
