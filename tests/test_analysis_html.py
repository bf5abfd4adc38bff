"""index.html's tables: written directly, they are the text pandas' to_html writes."""

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from armorlab.analysis.html import table_html

# any text, text made of what pandas treats specially (escapes, strips, turns into &nbsp;), table cells
TEXT = st.one_of(st.text(max_size=12), st.text(alphabet=" \t\n\r\xa0a<&'\"", max_size=8),
                 st.sampled_from(["a & b", "a  b", '<b>"q"</b>', "—", "0.5 [0.1, 0.9]", ""]))


def _pandas(df: pd.DataFrame) -> str:
    return df.to_html(index=False, escape=True, na_rep="—", border=0)


@st.composite
def frames(draw):
    rows = draw(st.integers(0, 6))
    cols = {}
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["object", "str", "int", "bool", "float", "Int64", "mixed"]))
        name = draw(st.sampled_from([f"c{i}", f"<c&{i}>", f"P(X > Y) {i}"]))
        if kind in ("object", "str"):
            values = draw(st.lists(st.one_of(TEXT, st.none()), min_size=rows, max_size=rows))
            cols[name] = pd.Series(values, dtype=object if kind == "object" else "str")
        elif kind == "int":
            cols[name] = np.array(draw(st.lists(st.integers(-10**12, 10**12), min_size=rows, max_size=rows)),
                                  dtype=np.int64)
        elif kind == "bool":
            cols[name] = np.array(draw(st.lists(st.booleans(), min_size=rows, max_size=rows)), dtype=bool)
        elif kind == "float":  # pandas formats floats column-wide: written by pandas itself
            cols[name] = np.array(draw(st.lists(st.floats(allow_nan=True), min_size=rows, max_size=rows)))
        elif kind == "Int64":
            cols[name] = pd.array(draw(st.lists(st.one_of(st.integers(0, 9), st.none()), min_size=rows,
                                                max_size=rows)), dtype="Int64")
        else:
            cols[name] = pd.Series(draw(st.lists(st.one_of(TEXT, st.integers(), st.floats()), min_size=rows,
                                                 max_size=rows)), dtype=object)
    return pd.DataFrame(cols)


@settings(max_examples=300, deadline=None)
@given(frames())
def test_tables_are_pandas_to_html(df):
    assert table_html(df) == _pandas(df)


def test_a_text_table_is_written_directly(monkeypatch):
    df = pd.DataFrame({"group": ["α=0.5", None], "n": [3, 4], "P(X > Y)": ["0.9 [0.6, 1]", "—"]})
    want = _pandas(df)
    monkeypatch.setattr(pd.DataFrame, "to_html", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    assert table_html(df) == want
