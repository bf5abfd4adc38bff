"""Value checks shared by every validated file (run configs, sweep specs, profiles).

Each check returns the normalised value or raises ``Invalid`` with what is wrong; the caller,
who knows the key and the file, turns it into an ArmorLabError.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any


class Invalid(Exception):
    """Raised by a check; turned into ArmorLabError with key, value and file by its caller."""


def boolean(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise Invalid("must be true or false")


def integer(lo: int | None = None, hi: int | None = None) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise Invalid("must be an integer")
        if lo is not None and v < lo:
            raise Invalid(f"must be ≥ {lo}")
        if hi is not None and v > hi:
            raise Invalid(f"must be ≤ {hi}")
        return v
    return check


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
           hi_open: bool = False) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise Invalid("must be a number")
        try:
            v = float(v)
        except OverflowError:  # an int with hundreds of digits
            raise Invalid("must be a finite number (this one overflows a float)") from None
        if not math.isfinite(v):
            raise Invalid("must be finite")
        if lo is not None and (v <= lo if lo_open else v < lo):
            raise Invalid(f"must be {'>' if lo_open else '≥'} {lo}")
        if hi is not None and (v >= hi if hi_open else v > hi):
            raise Invalid(f"must be {'<' if hi_open else '≤'} {hi}")
        return v
    return check


def choice(*choices: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if v not in choices:
            raise Invalid(f"must be one of {', '.join(choices)}")
        return v
    return check


def optional(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        return None if v is None else inner(v)
    return check


def text(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise Invalid("must be a non-empty string")
    return v


def address(v: Any) -> str:
    """A host name, IP address or URL: a non-empty string without whitespace or control characters
    (a pasted newline or tab would otherwise surface as a connection error deep in a job)."""
    v = text(v)
    bad = next((c for c in v if c.isspace() or ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise Invalid(f"must not contain whitespace or control characters (found {bad!r})")
    return v


def json_value(v: Any, where: str = "") -> Any:
    """``v`` unchanged if it is plain JSON data (what a run id is hashed from): strings, finite
    numbers, booleans, null, lists and string-keyed mappings of them. YAML also yields dates,
    NaN/inf, binary and non-string keys, which no run config can mean."""
    if v is None or isinstance(v, (str, bool, int)):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise Invalid(f"must be a finite number{where}")
        return v
    if isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            json_value(x, f"{where}[{i}]" if where else f" (item {i})")
        return v
    if isinstance(v, dict):
        for k, x in v.items():
            if not isinstance(k, str):
                raise Invalid(f"mapping keys must be strings, not {type(k).__name__} {k!r}")
            json_value(x, where)
        return v
    raise Invalid(f"must be plain data (a string, number, boolean, list or mapping), not a "
                  f"{type(v).__name__}{where}")


# Points a sweep grid or an exhaustive search space may expand to. Counted before anything is
# expanded, so a 10^10-point grid is refused in microseconds instead of filling memory.
MAX_POINTS_ENV = "ARMORLAB_MAX_POINTS"
DEFAULT_MAX_POINTS = 100_000


def max_points() -> int:
    """The limit: ``$ARMORLAB_MAX_POINTS`` when set to a positive integer, else 100,000."""
    raw = os.environ.get(MAX_POINTS_ENV, "")
    try:
        value = int(raw)
    except ValueError:
        return DEFAULT_MAX_POINTS
    return value if value > 0 else DEFAULT_MAX_POINTS


def within_max_points(n: int, what: str) -> int:
    """``n`` unless it exceeds ``max_points()``; raises Invalid saying how to override."""
    limit = max_points()
    if n > limit:
        raise Invalid(f"{what} has {count_text(n)} points, more than the limit of {limit:,} (set "
                      f"{MAX_POINTS_ENV} to allow more)")
    return n


def count_text(n: int) -> str:
    """``12,345`` or ``about 10^40`` (an int too large for a float is still printable)."""
    return f"{n:,}" if n < 10**7 else f"about 10^{len(str(int(n))) - 1}"


def did_you_mean(word: Any, choices: Any) -> str:
    """`` (did you mean 'learning_rate'?)`` for a near miss among ``choices`` (difflib), else ``""``."""
    import difflib  # here: only an error message needs it

    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, [c for c in choices if isinstance(c, str)], n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


# Environment variables that make a shell or the dynamic loader run code of their choosing when a
# process starts: bash sources $BASH_ENV (sh: $ENV) before a non-interactive script, exported
# BASH_FUNC_x%% functions replace commands, SHELLOPTS/BASHOPTS switch on xtrace with a PS4 that
# runs $(...), PROMPT_COMMAND runs at each prompt, LD_PRELOAD/LD_AUDIT load a library into every
# program. A profile's sbatch `export` and vllm_servers `env` may not set them.
STARTUP_HOOKS = ("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "LD_PRELOAD", "LD_AUDIT")


def startup_hook(name: str) -> bool:
    """Whether setting the environment variable ``name`` can run code at a process's start."""
    return name in STARTUP_HOOKS or name.startswith("BASH_FUNC_")


# Besides the start-up hooks: variables that choose which code a job runs — the programs found
# (PATH), the libraries loaded (any LD_*: LD_LIBRARY_PATH), the interpreters' start-up code and
# modules (PYTHONPATH, PYTHONSTARTUP, PYTHONHOME, PERL5OPT, PERL5LIB, RUBYOPT, NODE_OPTIONS).
# A profile's sbatch `export` sets them only when its `allow_exports` names them.
CODE_CHOOSING = ("PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PERL5OPT", "PERL5LIB",
                 "RUBYOPT", "RUBYLIB", "NODE_OPTIONS")


def runs_code(name: str) -> bool:
    """Whether exporting ``name`` to a job can change what code it runs (startup_hook, or CODE_CHOOSING)."""
    return startup_hook(name) or name in CODE_CHOOSING or name.startswith("LD_")


def no_nul(v: Any) -> Any:
    """``v`` unchanged unless its text holds a NUL byte (no argv word or environment value can:
    the process start fails with "embedded null byte" long after the check would have)."""
    if "\x00" in str(v):
        raise Invalid("must not contain a NUL byte")
    return v
