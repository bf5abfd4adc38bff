"""Plain command-line values without pydantic.

typer (0.29) coerces every parameter of the command being run through a pydantic
``TypeAdapter`` built on first use: importing pydantic and building the adapters costs about as
much as importing typer and rich together, at every command but ``--help`` — the floor under
``armorlab report`` of an unchanged report, ``sweep --dry-run`` and a submit. armorlab's
parameters are plain ``str``, ``int``, ``float``, ``bool`` and ``Path`` values and lists of them, which
need no schema: ``install()`` coerces exactly those with the builtin constructors (same error
wording as typer's) and leaves everything else — a ``min``/``max``, a custom ``parser``, file
or path checks, any other type — to typer. If typer's internals are not the expected ones it
does nothing, so a typer upgrade can only cost the speed-up, never the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

_PLAIN = {str: None, int: "a valid integer, unable to parse string as an integer",
          float: "a valid number, unable to parse string as a number", Path: None,
          bool: "a valid boolean, unable to interpret input"}
_BOOL = {"true": True, "1": True, "yes": True, "on": True, "t": True, "y": True,
         "false": False, "0": False, "no": False, "off": False, "f": False, "n": False}
_PATH_CHECKS = ("exists", "file_okay", "dir_okay", "writable", "readable", "resolve_path", "allow_dash")


def _element(annotation: Any) -> Any:
    """``T`` for ``T`` and ``list[T]``; None for anything else."""
    if get_origin(annotation) is list:
        args = get_args(annotation)
        return args[0] if len(args) == 1 else None
    return annotation


def _plain(descriptor: Any) -> Any:
    """The element type when typer's adapter would only call its constructor, else None."""
    info = descriptor.parameter_info
    elem = _element(descriptor.annotation)
    if elem not in _PLAIN or descriptor.file_annotation is not None:
        return None
    if getattr(info, "parser", None) is not None or getattr(info, "click_type", None) is not None:
        return None
    if getattr(info, "min", None) is not None or getattr(info, "max", None) is not None:
        return None
    if elem is Path and any(getattr(info, k, None) not in (None, False, True) or
                            (k in ("exists", "writable", "resolve_path") and getattr(info, k, False))
                            for k in _PATH_CHECKS):
        return None
    return elem


def install() -> bool:
    """Route plain parameters around typer's pydantic adapters; True when installed."""
    try:
        from typer import _coercion, core
        from typer._click.exceptions import BadParameter

        base, typer_build = _coercion.RuntimeParam, core.build_runtime_param
    except (ImportError, AttributeError):
        return False

    @dataclass(frozen=True)
    class PlainRuntimeParam(base):  # type: ignore[misc, valid-type]
        element: Any = None

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, (list, tuple)) and get_origin(self.annotation) is list:
                return [self._one(v, param, ctx) for v in value]
            return self._one(value, param, ctx)

        def _one(self, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, self.element) and (self.element is bool or not isinstance(value, bool)):
                return value
            try:
                if self.element is bool:
                    return _BOOL[str(value).strip().lower()]
                return self.element(value)
            except (TypeError, ValueError, KeyError):
                raise BadParameter(f"Input should be {_PLAIN[self.element] or 'a valid ' + self.element.__name__}",
                                   ctx=ctx, param=param) from None

    def build_runtime_param(descriptor: Any) -> Any:
        elem = _plain(descriptor)
        if elem is None:
            return typer_build(descriptor)
        return PlainRuntimeParam(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation,
                                 element=elem)

    core.build_runtime_param = build_runtime_param
    return True
