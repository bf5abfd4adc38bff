"""Is a directory a loadable Hugging Face model? Checked before anything loads it (torch-free).

A damaged model directory used to pass ``config.resolve`` (it only asked for a ``config.json``)
and end, minutes later inside a job, in a transformers traceback. ``check_model_dir`` names the
problem instead, from what a few small reads show:

- ``config.json``: a regular file holding a JSON object with a ``model_type``;
- weights: a ``*.safetensors`` or ``pytorch_model*.bin`` file, or an index whose every shard is
  there; each safetensors file's header (its first 8 bytes + a JSON header) parses and the tensors
  it lists fit in the file (an empty, truncated or overwritten file fails here);
- a tokenizer (``tokenizer.json``, ``tokenizer_config.json``, ``tokenizer.model`` or
  ``vocab.json``), and every JSON file of the model parses;
- nothing in the directory is a FIFO, socket or device, a symlink loop or a dangling link.

Deeper damage (a config.json value transformers refuses) is found by ``armorlab.train.models``
loading the config alone, still before the weights. Results are cached per file stat.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

from armorlab.core.fsutil import NotRegularFile, read_regular

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")
MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit on a header


class ModelDirProblem(Exception):
    """What is wrong with a model directory, and the file that shows it."""

    def __init__(self, message: str, file: str) -> None:
        super().__init__(message)
        self.file = file


def entry_problem(path: Path) -> str | None:
    """Why ``path`` (an entry of a model or data dir) cannot be read as a file, else None."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symlink loop"
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return f"is a dangling symlink (to {os.readlink(path)})"
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    kind = "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) \
        else "a device"
    return f"is {kind}, not a regular file"


@lru_cache(maxsize=1024)
def _json_problem(path: str, size: int, mtime_ns: int) -> str | None:  # noqa: ARG001 - cache key
    if size > MAX_JSON_BYTES:
        return None  # a huge tokenizer.json: its loader tells
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return f"is not valid JSON ({str(exc).splitlines()[0][:120]})"
    except RecursionError:
        return "is not valid JSON (nested too deeply)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None if isinstance(data, dict) else f"must hold a JSON object, not a {type(data).__name__}"


def _load_json(path: Path) -> Any:
    st = path.stat()
    problem = _json_problem(str(path), st.st_size, st.st_mtime_ns)
    if problem:
        raise ModelDirProblem(f"{path.name} {problem}", str(path))
    return json.loads(read_regular(path).decode("utf-8")) if st.st_size <= MAX_JSON_BYTES else {}


@lru_cache(maxsize=1024)
def _safetensors_problem(path: str, size: int, mtime_ns: int) -> str | None:  # noqa: ARG001 - cache key
    """Why a .safetensors file cannot be loaded, from its header alone (safetensors' format: an
    8-byte little-endian header length, a JSON header, then the tensor bytes)."""
    if size < 8:
        return f"is {'empty' if size == 0 else 'truncated'} ({size} bytes): not a safetensors file"
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > min(MAX_HEADER_BYTES, size - 8):
                return "is not a safetensors file (its header length does not fit the file: damaged or truncated)"
            header = json.loads(fh.read(n).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return "is not a safetensors file (its header is not JSON: damaged)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not isinstance(header, dict):
        return "is not a safetensors file (damaged header)"
    data_bytes = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"has a damaged header (tensor {name!r})"
        if offsets[1] > data_bytes:
            return f"is truncated: tensor {name!r} ends at byte {offsets[1]:,} of {data_bytes:,}"
    return None


def _check_safetensors(path: Path) -> None:
    st = path.stat()
    problem = _safetensors_problem(str(path), st.st_size, st.st_mtime_ns)
    if problem:
        raise ModelDirProblem(f"{path.name} {problem}", str(path))


def check_model_dir(root: str | os.PathLike) -> None:
    """Raise ModelDirProblem naming the first problem that would stop transformers loading the model
    in ``root`` (see the module docstring)."""
    root = Path(root)
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        raise ModelDirProblem(f"cannot list the model directory ({exc.strerror})", str(root)) from None
    for name in names:
        problem = entry_problem(root / name)
        if problem:
            raise ModelDirProblem(f"{name} {problem}", str(root / name))
    cfg_path = root / "config.json"
    if "config.json" not in names:
        raise ModelDirProblem("not a Hugging Face model directory (no config.json)", str(cfg_path))
    if cfg_path.is_dir():
        raise ModelDirProblem("config.json is a directory, not a file", str(cfg_path))
    config = _load_json(cfg_path)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelDirProblem("config.json has no model_type (transformers needs it to pick the architecture)",
                              str(cfg_path))
    for section in (config, config.get("text_config")):
        problem = sizes_problem(section) if isinstance(section, dict) else None
        if problem:
            raise ModelDirProblem(f"config.json: {problem}", str(cfg_path))
    for name in names:
        if name.endswith(".json") and (root / name).is_file():
            _load_json(root / name)
    _check_chat_template(root, names)
    _check_weights(root, names)
    if not any(n in names for n in TOKENIZER_FILES):
        raise ModelDirProblem(f"no tokenizer ({', '.join(TOKENIZER_FILES[:4])}): save it with "
                              "tokenizer.save_pretrained(<dir>)", str(root))


# config.json's sizes, each a positive integer below a bound far above any released model's (a
# vocabulary of 1e12 would make the embedding alone 4 TB: a typo, found here, not by the allocator)
SIZE_BOUNDS = {"vocab_size": 1 << 24, "hidden_size": 1 << 20, "intermediate_size": 1 << 22,
               "num_hidden_layers": 10_000, "num_attention_heads": 1 << 16, "num_key_value_heads": 1 << 16,
               "head_dim": 1 << 16, "max_position_embeddings": 1 << 28}


def sizes_problem(cfg: dict[str, Any]) -> str | None:
    """Why one of config.json's sizes (SIZE_BOUNDS) cannot be a model's: the field and value named."""
    for key, bound in SIZE_BOUNDS.items():
        value = cfg.get(key)
        if value is None:
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not whole or not 1 <= value <= bound:
            return f"{key} is {value!r}: must be a whole number from 1 to {bound:,}"
    return None


def _chat_template(root: Path, names: list[str]) -> tuple[str, str] | None:
    """(the chat template saved with the tokenizer, the file it is in), or None."""
    if "chat_template.jinja" in names:
        path = root / "chat_template.jinja"
        return read_regular(path, limit=MAX_JSON_BYTES).decode("utf-8", errors="replace"), str(path)
    for name, key in (("chat_template.json", "chat_template"), ("tokenizer_config.json", "chat_template")):
        if name in names:
            value = _load_json(root / name).get(key)
            if isinstance(value, list):  # named templates: [{name, template}]; the default one is used
                value = next((t.get("template") for t in value if isinstance(t, dict) and t.get("name") == "default"),
                             None)
            if isinstance(value, str) and value:
                return value, str(root / name)
    return None


@lru_cache(maxsize=64)
def template_problem(template: str) -> str | None:
    """Why a chat template cannot turn a one-question conversation into a prompt: it does not parse,
    or it raises (rendered as transformers renders it: Jinja2's sandbox, ``raise_exception``)."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    try:
        compiled = env.from_string(template)
    except TemplateError as exc:
        return f"does not parse: {str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}"
    try:
        compiled.render(messages=[{"role": "user", "content": "What is 1 + 1?"}], add_generation_prompt=True,
                        bos_token="<s>", eos_token="</s>", tools=None, documents=None)
    except Exception as exc:  # noqa: BLE001 - whatever a template raises, it cannot make a prompt
        return f"raises {type(exc).__name__} on a one-question conversation: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return None


def _check_chat_template(root: Path, names: list[str]) -> None:
    found = _chat_template(root, names)
    problem = template_problem(found[0]) if found else None
    if problem:
        raise ModelDirProblem(f"the chat template {problem}", found[1])


def _check_weights(root: Path, names: list[str]) -> None:
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if index_name in names:
            index = _load_json(root / index_name)
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ModelDirProblem(f"{index_name} has no weight_map", str(root / index_name))
            for shard in sorted({v for v in weight_map.values() if isinstance(v, str)}):
                path = root / shard
                if not path.is_file():
                    raise ModelDirProblem(f"{index_name} names the shard {shard}, which is missing",
                                          str(path))
                if shard.endswith(".safetensors"):
                    _check_safetensors(path)
            return
    tensors = [n for n in names if n.endswith(".safetensors")]
    for name in tensors:
        if (root / name).is_dir():
            raise ModelDirProblem(f"{name} is a directory, not a weights file", str(root / name))
        _check_safetensors(root / name)
    bins = [n for n in names if n.startswith("pytorch_model") and n.endswith(".bin")]
    for name in bins:
        if not (root / name).is_file() or (root / name).stat().st_size == 0:
            raise ModelDirProblem(f"{name} is empty or not a file", str(root / name))
    if not tensors and not bins and not any(n in names for n in WEIGHT_FILES):
        raise ModelDirProblem("no weights (model.safetensors, pytorch_model.bin or a sharded index): "
                              "save them with model.save_pretrained(<dir>)", str(root))


def max_positions(root: str | os.PathLike) -> int | None:
    """The longest sequence the model in ``root`` takes (config.json's max_position_embeddings,
    n_positions or max_sequence_length, or its text_config's), None when it does not say."""
    try:
        config = _load_json(Path(root) / "config.json")
    except (ModelDirProblem, OSError, NotRegularFile):
        return None
    for section in (config, config.get("text_config")):
        if isinstance(section, dict):
            for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
                value = section.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return None
