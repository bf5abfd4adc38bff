"""armorlab.commands.coercion reaches into typer's private internals (typer._coercion, typer.core):
this test names each one it relies on, so a typer release that changes them fails here rather than
silently costing the speed-up (install() would return False) or, worse, the CLI's coercion."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys


def test_the_typer_internals_coercion_patches_are_still_there():
    from typer import _coercion, core
    from typer._click.exceptions import BadParameter

    # PlainRuntimeParam subclasses RuntimeParam, built with exactly these fields, and overrides
    # _coerce_value(value, param, ctx), which RuntimeParam.coerce calls
    assert dataclasses.is_dataclass(_coercion.RuntimeParam)
    assert [f.name for f in dataclasses.fields(_coercion.RuntimeParam)] == ["parameter_info", "annotation"]
    assert list(inspect.signature(_coercion.RuntimeParam._coerce_value).parameters) == ["self", "value", "param",
                                                                                        "ctx"]
    assert "_coerce_value" in inspect.getsource(_coercion.RuntimeParam.coerce)
    # build_runtime_param(descriptor) is the module-level hook typer's parameters call by name, with a
    # TypeDescriptor carrying the three fields coercion._plain reads
    assert list(inspect.signature(core.build_runtime_param).parameters) == ["descriptor"]
    assert "build_runtime_param(self.type_descriptor)" in inspect.getsource(core)
    assert {f.name for f in dataclasses.fields(_coercion.TypeDescriptor)} >= {"annotation", "parameter_info",
                                                                               "file_annotation"}
    assert issubclass(BadParameter, Exception)


def test_install_takes_effect_in_a_fresh_interpreter():
    code = ("import typer.core as core\nfrom armorlab.commands import coercion\nbefore = core.build_runtime_param\n"
            "print(coercion.install(), core.build_runtime_param is not before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]
