#!/usr/bin/env python
"""Regenerate armorlab/core/grpo_fields.json from the installed TRL: {field: kind}.

    .venv/bin/python tools/gen_grpo_fields.py > armorlab/core/grpo_fields.json

kind: str / float / int / bool / map (a mapping, or its JSON text), "?" when null is allowed, "any" for
other types. armorlab.core.config
checks TRL values by kind without importing TRL; tests/test_config.py checks the file is current.
After a TRL upgrade also classify any new field in armorlab/core/trl_fields.py (honoured, mapped or
rejected): tests/test_trl_fields.py fails on an unclassified one.
"""
import dataclasses
import json
import sys
import typing

from trl import GRPOConfig


def kind(annotation):
    args = set(typing.get_args(annotation)) or {annotation}
    optional = type(None) in args
    args.discard(type(None))
    if any(a is dict or typing.get_origin(a) is dict for a in args):
        k = "map"  # e.g. model_init_kwargs: dict | str | None (TrainingArguments parses a JSON string)
    elif str in args or any(isinstance(a, type) and issubclass(a, str) for a in args):
        k = "str"
    elif float in args:
        k = "float"
    elif int in args and bool not in args:
        k = "int"
    elif args == {bool}:
        k = "bool"
    else:
        k = "any"
    return k + ("?" if optional and k != "any" else "")

json.dump({f.name: kind(f.type) for f in dataclasses.fields(GRPOConfig)}, sys.stdout, indent=0, sort_keys=True)
