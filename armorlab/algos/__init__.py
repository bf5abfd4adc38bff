"""Pure math, one equation per function, no I/O: policy objectives (registered with their metadata
by one decorator), probability capacity, group advantages, dynamic sampling and the KL estimators.

Importing this package (or ``armorlab.algos.objectives``, the registry) does not import torch; the
functions run on the tensors they are given."""

# The remedies the field uses now (TRL's and verl's losses), registered after the built-ins: here, not
# at the end of objectives.py, so that the registry and the objectives built on it import no circle.
from armorlab.algos import field_objectives  # noqa: E402, F401
