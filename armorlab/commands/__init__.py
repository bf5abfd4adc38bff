"""CLI commands. Each module defines ``register(app)`` and imports heavy libraries only inside
the command body, so ``armorlab --help`` never loads torch or TRL."""

# A pipe or a log file has no width: rich would assume 80 columns and cut table cells (`compl…`,
# `427fa…`). Off a terminal, and unless COLUMNS says otherwise, lines are as long as they need.
UNBOUNDED_WIDTH = 1000


def console(*, stderr: bool = False):
    """A rich Console for the CLI's output: the terminal's width, else UNBOUNDED_WIDTH."""
    import os
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    wide = not stream.isatty() and not os.environ.get("COLUMNS")
    return Console(stderr=stderr, width=UNBOUNDED_WIDTH if wide else None)
