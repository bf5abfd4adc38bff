"""Pure math, one equation per function, no I/O: policy objectives (registered with their metadata
by one decorator), probability capacity, group advantages, dynamic sampling and the KL estimators.

Importing this package (or ``armorlab.algos.objectives``, the registry) does not import torch; the
functions run on the tensors they are given."""
