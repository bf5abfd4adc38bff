"""The TRL glue that trains a run: ``ArmorLabTrainer`` and its hooks, ``ArmorLabConfig``, anchors,
the reference policy, evaluation, telemetry, the launcher of a run directory, tiny models and the
vLLM reference sampler and client. The only layer that imports torch, transformers and TRL."""
