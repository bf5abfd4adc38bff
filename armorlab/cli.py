"""The ``armorlab`` command. Start-up stays light: each command imports its heavy work lazily."""

from __future__ import annotations

import logging
import sys

import typer

from armorlab import __version__
from armorlab.commands import demo, report, sweep, train, tune
from armorlab.errors import ArmorLabError

app = typer.Typer(
    name="armorlab",
    help="Ablations for ARMOR and UP policy objectives in LLM RL with verifiable rewards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"armorlab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at INFO level."),
) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


for module in (train, sweep, tune, report, demo):
    module.register(app)


def main() -> None:
    """Entry point: user errors print one line to stderr and exit 2, without a traceback."""
    try:
        rc = app(standalone_mode=False)
    except ArmorLabError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # click usage errors arrive here in standalone_mode=False
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
