"""How an ``armorlab`` process ends: by default as any Python program, through the interpreter's
teardown; a command that leaves nothing to it (every file written and renamed into place, no
thread or child still running) may end the process without it. After a report, the teardown
(freeing the runs' tables, pandas, pyarrow and every module) took ~0.1 s, ~3 % of a cold report."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

_skip_teardown = False


def skip_teardown() -> None:
    """Called by a command when its work is done and nothing needs the interpreter's teardown;
    acted on only by :func:`end` (the process's entry point), never by in-process callers."""
    global _skip_teardown
    _skip_teardown = True


def end(code: object) -> NoReturn:
    """Exit with ``code`` as ``sys.exit`` would; without the teardown when a command allowed it
    and the code is a number (a message code is printed by ``sys.exit`` itself)."""
    if _skip_teardown and (code is None or isinstance(code, int)):
        logging.shutdown()  # flushes and closes the log handlers, as the teardown would
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say there
                stream.flush()
        os._exit(code or 0)
    sys.exit(code)
