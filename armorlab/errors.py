"""The one exception type for errors a user can cause (bad config, spec, path or value)."""

from __future__ import annotations

from typing import Any

MAX_VALUE_CHARS = 160


class ArmorLabError(ValueError):
    """A user-fixable error. The message names the key, the value and the file when known.

    Subclasses ValueError so library callers that validate arguments (``policy_loss``) and
    callers that catch ValueError both work; the CLI prints it without a traceback, exit 2.
    """

    def __init__(self, message: str, *, key: str | None = None, value: Any = None,
                 file: str | None = None) -> None:
        self.key, self.value, self.file = key, value, file
        self.problems: list[ArmorLabError] = [self]
        parts = []
        if key is not None:
            parts.append(f"key '{key}'")
            shown = _shown(value)
            if len(shown) > MAX_VALUE_CHARS:  # a 400-digit number or a pasted file: say what, not all
                shown = f"{shown[:MAX_VALUE_CHARS // 2]}…{shown[-20:]} ({len(shown)} chars)"
            parts.append(f"value {shown}")
        if file is not None:
            parts.append(f"in {file}")
        where = (" [" + ", ".join(parts) + "]") if parts else ""
        super().__init__(f"{message}{where}")


def _shown(value: Any) -> str:
    try:
        return repr(value)
    except (ValueError, RecursionError):  # an int past str()'s 4,300 digits, a structure nested past the limit
        if isinstance(value, int):
            return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
        return f"<a deeply nested {type(value).__name__}>"


def combine(problems: list[ArmorLabError]) -> ArmorLabError:
    """One ArmorLabError reporting every problem found in a file at once (a user fixes them in
    one round trip): the only one as it is, else a numbered list; key, value and file are the
    first problem's, and ``problems`` holds them all."""
    if len(problems) == 1:
        return problems[0]
    lines = "\n".join(f"  {i}. {p}" for i, p in enumerate(problems, 1))
    files = {p.file for p in problems}
    where = f" in {files.pop()}" if len(files) == 1 and None not in files else ""
    err = ArmorLabError(f"{len(problems)} problems{where}:\n{lines}")
    err.key, err.value, err.file = problems[0].key, problems[0].value, problems[0].file
    err.problems = list(problems)
    return err
