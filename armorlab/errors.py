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
        parts = []
        if key is not None:
            parts.append(f"key '{key}'")
            shown = repr(value)
            if len(shown) > MAX_VALUE_CHARS:  # a 400-digit number or a pasted file: say what, not all
                shown = f"{shown[:MAX_VALUE_CHARS // 2]}…{shown[-20:]} ({len(shown)} chars)"
            parts.append(f"value {shown}")
        if file is not None:
            parts.append(f"in {file}")
        where = (" [" + ", ".join(parts) + "]") if parts else ""
        super().__init__(f"{message}{where}")
