"""How an armorlab process says how it ended: the exit codes of ``armorlab train`` (and of every
command), defined once, and the words for a child's return code."""

from __future__ import annotations

import signal

EXIT_OK = 0            # done (also: the run was already completed)
EXIT_FAILED = 1        # the run failed; status.json says why
EXIT_USER_ERROR = 2    # bad config, spec, path or value (ArmorLabError): nothing was started
EXIT_BUSY = 73         # another live process owns (trains) this run dir: nothing was done (EX_CANTCREAT)
EXIT_NO_SPACE = 74     # the disk filled up (a checkpoint or log write failed); status.json says where; free
                       # space and run it again to resume from the last complete checkpoint (EX_IOERR)
EXIT_PREEMPTED = 75    # stopped by a preemption signal after a checkpoint: resume it (EX_TEMPFAIL)


def describe_exit(rc: int) -> str:
    """``"exit code 3"`` or ``"signal SIGKILL"`` for a child's return code (negative: a signal)."""
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"
