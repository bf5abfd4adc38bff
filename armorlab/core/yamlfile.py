"""Reading armorlab's YAML files (configs, specs, profiles, recipes): PyYAML's safe loader, strict.

A key given twice is an error (PyYAML keeps the last one silently), and so is what PyYAML lets
through as a Python exception instead of a YAML error: an integer longer than Python reads (its
key and line are named), a ``\\U`` escape past U+10FFFF, nesting past the recursion limit (or past
MAX_YAML_DEPTH levels, which no armorlab file needs). A file that is not a regular file (a FIFO)
is never opened to block.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from armorlab.core.fsutil import read_regular_text
from armorlab.errors import ArmorLabError


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML
    silently keeps the last one: ``alpha: 0.9`` then ``alpha: 0.5`` would train 0.5)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # keys a merge (<<) brings may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            if _too_long_int(value_node):
                raise LongInteger(key, value_node)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # unhashable key: the base class reports it
                break
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r} (first at line {first.start_mark.line + 1})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if _too_long_int(node):  # in a list: no key to name, the line says where
            raise LongInteger(None, node)
        return super().construct_yaml_int(node)


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", UniqueKeyLoader.construct_yaml_int)
_INT_TAG = "tag:yaml.org,2002:int"


def _too_long_int(node: Any) -> bool:
    """An int scalar that Python's int() refuses (over sys.get_int_max_str_digits() digits)."""
    import sys

    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
    return bool(limit) and isinstance(node, yaml.ScalarNode) and node.tag == _INT_TAG and \
        sum(c.isdigit() for c in node.value) > limit


class LongInteger(yaml.YAMLError):
    """An integer too long for Python to read (a pasted number, a fuzzer's 5,000 digits)."""

    def __init__(self, key: Any, node: yaml.ScalarNode) -> None:
        self.key, self.digits, self.line = key, sum(c.isdigit() for c in node.value), node.start_mark.line + 1
        super().__init__(f"an integer of {self.digits:,} digits at line {self.line}")


MAX_YAML_DEPTH = 100  # no armorlab file nests past a handful of levels


def load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        content = read_regular_text(path)
    except OSError as exc:
        raise ArmorLabError(f"cannot read file: {exc.strerror or exc}", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise ArmorLabError(f"not UTF-8 text (byte {exc.start}: {exc.reason})", file=str(path)) from None
    try:
        data = yaml.load(content, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except LongInteger as exc:
        raise ArmorLabError(f"{exc}: too long to be a number (Python reads at most "
                            f"{sys.get_int_max_str_digits():,})", key=None if exc.key is None else str(exc.key),
                            value=f"<{exc.digits:,} digits>", file=str(path)) from None
    except yaml.YAMLError as exc:
        raise ArmorLabError(f"invalid YAML: {exc}", file=str(path)) from None
    except ValueError as exc:  # PyYAML lets some bad scalars through as ValueError (\U escapes past U+10FFFF)
        raise ArmorLabError(f"invalid YAML: {exc}", file=str(path)) from None
    except RecursionError:
        raise ArmorLabError("invalid YAML: nested too deeply to be a config", file=str(path)) from None
    if _depth(data) > MAX_YAML_DEPTH:
        raise ArmorLabError(f"nested more than {MAX_YAML_DEPTH} levels deep: not a config", file=str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ArmorLabError("top level must be a mapping", key="<root>", value=type(data).__name__,
                            file=str(path))
    return data


def _depth(data: Any, limit: int = MAX_YAML_DEPTH + 1) -> int:
    """Nesting depth of lists and mappings, counted up to ``limit`` (iteratively: no recursion)."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest >= limit:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest
