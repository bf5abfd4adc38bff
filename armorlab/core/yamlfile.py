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
        data = _load_bounded(content, str(path))
    except ArmorLabError:
        raise
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
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ArmorLabError("top level must be a mapping", key="<root>", value=type(data).__name__,
                            file=str(path))
    return data


def _load_bounded(content: str, file: str) -> Any:
    """``yaml.load`` with the node graph measured before any object is built: its depth and the size
    it expands to through aliases (``&a [*b, *b, ...]`` nine times over is a billion values from a
    few lines; measured on the graph, each node once, it is refused at once)."""
    loader = UniqueKeyLoader(content)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        depth, size = _shape(node)
        if depth > MAX_YAML_DEPTH:
            raise ArmorLabError(f"nested more than {MAX_YAML_DEPTH} levels deep: not a config", file=file)
        if size > MAX_YAML_VALUES:
            raise ArmorLabError(f"expands through its aliases (&anchor / *alias) to more than {MAX_YAML_VALUES:,} "
                                "values: not a config (an alias bomb?)", file=file)
        return loader.construct_document(node)
    finally:
        loader.dispose()


MAX_YAML_VALUES = 1_000_000  # values once aliases are expanded; a 1,000-point sweep spec holds ~20,000


def _shape(root: yaml.Node) -> tuple[int, int]:
    """(nesting depth, values once aliases are expanded) of a composed YAML node graph: each node is
    measured once (aliases share nodes), iteratively (no recursion); a node that contains itself
    (``&a [*a]``) is infinitely deep."""
    memo: dict[int, tuple[int, int]] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        kids = [] if isinstance(node, yaml.ScalarNode) else \
            [v for pair in node.value for v in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        if children_done:
            on_path.discard(id(node))
            depth = 1 + max(memo[id(k)][0] for k in kids) if kids else 0
            size = min(1 + sum(memo[id(k)][1] for k in kids), MAX_YAML_VALUES + 1)
            memo[id(node)] = (depth, size)
            continue
        if id(node) in memo:
            continue
        on_path.add(id(node))
        stack.append((node, True))
        for k in kids:
            if id(k) in on_path:
                return MAX_YAML_DEPTH + 1, MAX_YAML_VALUES + 1
            if id(k) not in memo:
                stack.append((k, False))
    return memo[id(root)]
