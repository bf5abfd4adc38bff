"""The one lazy-import helper (armorlab.core.lazy): nothing is imported until a name is asked for."""

import subprocess
import sys

import pytest

from armorlab.core.lazy import Lazy


def test_nothing_is_imported_before_first_use():
    code = ("import sys\nfrom armorlab.core.lazy import Lazy\nsp = Lazy('scipy.special', 'scipy.optimize')\n"
            "print('scipy.special' in sys.modules, end=' ')\nsp.brentq\n"
            "print('scipy.special' in sys.modules, 'scipy.optimize' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]  # brentq: not in special, found in optimize


def test_names_come_from_the_first_source_that_has_them():
    import math

    calls = []
    lazy = Lazy(lambda: calls.append(1) or math, "os")
    assert lazy.sqrt(9.0) == 3.0 and lazy.sqrt is math.sqrt and calls == [1]  # kept after the first access
    assert lazy.sep in ("/", "\\")
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = lazy.no_such_name
