"""The one exception type for errors a user can cause (bad config, spec, path or value)."""

from __future__ import annotations

from typing import Any


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
            parts.append(f"value {value!r}")
        if file is not None:
            parts.append(f"in {file}")
        where = (" [" + ", ".join(parts) + "]") if parts else ""
        super().__init__(f"{message}{where}")
