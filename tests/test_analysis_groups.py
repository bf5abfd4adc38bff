"""Grouping helpers: which config keys vary between runs."""

import json

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from armorlab.analysis import groups as G
from armorlab.analysis.value_labels import norm_value

# values a flattened config can hold, with look-alikes that must (or must not) count as equal
VALUES = [0.0, -0.0, 1, 1.0, True, np.float64(0.5), 0.5, np.int64(3), 3, None, "a", "b", '["x", 1]',
          float("nan")]


@settings(max_examples=200, deadline=None)
@given(columns=st.lists(st.lists(st.sampled_from(VALUES), min_size=1, max_size=6), min_size=1, max_size=5))
def test_varying_keys_is_the_json_definition(columns):
    n = min(len(c) for c in columns)
    runs = pd.DataFrame({f"k{i}": pd.Series(c[:n], dtype=object) for i, c in enumerate(columns)})
    runs.insert(0, "run_id", [f"r{i}" for i in range(n)])
    want = [k for k in runs.columns if k != "run_id"
            and len({json.dumps(norm_value(v), sort_keys=True, default=str) for v in runs[k].tolist()}) > 1]
    assert G.varying_keys(runs) == want
