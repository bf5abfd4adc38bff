"""The ``armorlab`` command. Start-up stays light: each command imports its heavy work lazily."""

from __future__ import annotations

import logging
import sys

import typer

from armorlab._version import __version__
from armorlab.commands import (
    check_task,
    coercion,
    demo,
    evaluate,
    plan,
    report,
    sweep,
    train,
    tune,
    vllm_serve,
)
from armorlab.core.exits import EXIT_USER_ERROR
from armorlab.errors import ArmorLabError

coercion.install()  # plain values without pydantic (armorlab.commands.coercion)

app = typer.Typer(
    name="armorlab",
    help="Ablations for ARMOR and UP policy objectives in LLM RL with verifiable rewards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help formatter: rich's (typer.rich_utils → rich.markdown, markdown_it) costs
    # ~0.1 s at every `--help`, more than typer and rich themselves take to import
    rich_markup_mode=None,
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
    # the tiny model's build is the one long phase before a first step: it always says what it does
    logging.getLogger("armorlab.train.models").setLevel(logging.INFO)


for module in (train, check_task, sweep, plan, tune, report, evaluate, demo, vllm_serve):
    module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors print one line to stderr and exit 2, without a traceback; usage
    errors print the usage line too (exit 2). ``argv`` defaults to ``sys.argv[1:]``."""
    try:
        rc = app(args=argv, prog_name="armorlab", standalone_mode=False)
    except ArmorLabError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USER_ERROR)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except _click_exceptions() as exc:  # usage errors arrive here in standalone_mode=False
        exc.show()  # the usage line and the error; UsageError's exit code is 2
        if "unexpected extra argument" in str(exc) and "=" in str(exc):
            typer.echo("hint: give --set once per key: --set model=tiny --set task.digits=3", err=True)
        sys.exit(exc.exit_code)
    sys.exit(rc if isinstance(rc, int) else 0)


def _click_exceptions() -> tuple[type[BaseException], ...]:
    """The ClickException class(es) that Typer raises. Typer ≥ 0.29 bundles its own click
    (``typer._click``), older ones use the ``click`` package; take the class from the MRO of
    ``typer.BadParameter`` (public in both) and add ``click``'s when it is installed."""
    found = [c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"]
    try:
        import click

        found.append(click.ClickException)
    except ImportError:
        pass
    return tuple(dict.fromkeys(found))


def run() -> None:
    """The process's entry point (the ``armorlab`` script, ``python -m armorlab[.cli]``)."""
    main()


if __name__ == "__main__":
    run()
