"""Property-based fuzzing of every file a user hands armorlab (issue 13 §4), shared by
tests/test_fuzz.py (a small sample in CI) and benchmarks/fuzz.py (≥ 10,000 cases).

Each case writes generated files, runs the CLI in-process (``armorlab.cli.main``, exactly what
the ``armorlab`` script runs) and records how it ended: exit 0, exit 2, or a traceback (any other
exception, any other exit code, or "Traceback" on stderr). Inputs mix plausible values (known
keys, sensible numbers) with hostile ones (huge ints, NaN, dates, control characters, binary,
duplicate keys, torn lines), so most cases reach deep validation instead of failing at the door.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import math
import os
import shutil
import signal
import tempfile
import threading
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from armorlab.core.config import FIELDS, MODEL_FIELDS_TINY, TASK_FIELDS, TRL_DEFAULTS
from armorlab.sweeps.profile import PROFILE_FIELDS

# --------------------------------------------------------------------------- running the CLI
OK, USER_ERROR = 0, 2


@contextlib.contextmanager
def _no_scontrol():
    """Dry runs with the slurm executor ask scontrol for MaxArraySize: answer without a cluster."""
    from armorlab.sweeps import slurmctl

    saved = slurmctl.max_array_size
    slurmctl.max_array_size = lambda *a, **k: 1001
    try:
        yield
    finally:
        slurmctl.max_array_size = saved


class _Hang(BaseException):
    """Raised by the alarm of a case that runs past HANG_S (a FIFO opened for reading, a loop)."""


HANG_S = 20  # seconds; no case needs more than a few


@contextlib.contextmanager
def _alarm(seconds: int):
    def ring(*_):
        raise _Hang

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str]) -> tuple[Any, str]:
    """(exit code, "hang", or "traceback: ..." when it crashed; stderr)."""
    from armorlab.cli import main

    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), _no_scontrol(), \
                _alarm(HANG_S):
            main(argv)
        rc: Any = 0
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except _Hang:
        rc = "hang"
    except BaseException:  # noqa: BLE001 - the point: anything else is a traceback
        rc = "traceback: " + traceback.format_exc(limit=-3)
    text = err.getvalue()
    if "Traceback" in text and not isinstance(rc, str):
        rc = "traceback on stderr: " + text[-800:]
    return rc, text


class Tally:
    """Counts outcomes; keeps the first few tracebacks with the case that caused them. A case whose
    input ran (a ``$(touch PWNED)`` in a value executed: a PWNED file appeared) counts as a payload."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.tracebacks: list[str] = []

    def add(self, kind: str, rc: Any, case: str) -> None:
        ok = rc in (OK, USER_ERROR)
        outcome = "payload" if _payload_ran() else rc if ok else "hang" if rc == "hang" else \
            "wrong" if str(rc).startswith("wrong") else "traceback"
        self.counts[(kind, outcome)] += 1
        if outcome not in (OK, USER_ERROR) and len(self.tracebacks) < 20:
            self.tracebacks.append(f"[{kind}] {outcome}: {str(rc)[:1500]}\ncase: {case[:1500]}")

    @property
    def n(self) -> int:
        return sum(self.counts.values())

    @property
    def n_tracebacks(self) -> int:
        return sum(v for (_, rc), v in self.counts.items() if rc == "traceback")

    def total(self, outcome: str) -> int:
        return sum(v for (_, rc), v in self.counts.items() if rc == outcome)


def _payload_ran() -> bool:
    """A hostile value's ``$(touch PWNED)`` ran somewhere a case could have put it (the working dir)."""
    found = Path("PWNED").exists()
    if found:
        Path("PWNED").unlink()
    return found


# --------------------------------------------------------------------------- values
_CONTROL = st.sampled_from(["\n", "\r", "\x00", "\t", "\x1b", "\u2028", "\x7f"])
hostile_text = st.one_of(
    st.text(max_size=12),
    st.builds(lambda a, c, b: a + c + b, st.text(max_size=5), _CONTROL, st.text(max_size=5)),
    st.sampled_from(["$(touch PWNED)", "`id`", "a; rm -rf /", "x' #", "", " ", "..", "../..", "/", "~",
                     "tiny", "arithmetic", "math", "dapo", "armor", "up", "val/acc", "1e-5", ".nan",
                     "none", "null", "true", "0x10", "1_000", "é", "a" * 300]),
)
numbers = st.one_of(
    st.integers(-3, 300), st.integers(), st.sampled_from([0, 1, 2, -1, 2**32, 2**63, 2**64, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(-2.0, 2.0),
    st.sampled_from([0.0, 1e-12, 5e-5, 0.5, 1.0, 1e308]),
)
scalars = st.one_of(numbers, hostile_text, st.booleans(), st.none(),
                    st.dates(min_value=datetime.date(1990, 1, 1), max_value=datetime.date(2100, 1, 1)),
                    st.binary(max_size=6))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(hostile_text, inner, max_size=3)),
                      max_leaves=8)

TRL_KEYS = sorted(TRL_DEFAULTS) + ["epsilon", "epsilon_high", "report_to", "label_names", "run_name", "top_p",
                                   "top_k", "num_iterations", "bf16", "use_cpu", "max_prompt_length",
                                   "use_vllm", "loss_type", "lr_scheduler_type", "data_seed", "eval_steps",
                                   # issue 30: TRL's vLLM fields and the fields that take a name
                                   "vllm_mode", "vllm_server_port", "vllm_server_host", "vllm_group_port",
                                   "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size", "vllm_server_base_url",
                                   "vllm_server_timeout", "scale_rewards", "optim", "save_strategy"]
CONFIG_KEYS = sorted(FIELDS) + TRL_KEYS + ["task", "model", "output_dir", "not_a_key", "task.digits"]


def _plausible(key: str) -> st.SearchStrategy:
    """Values near what the key takes, so validation goes deep; the generic ones cover the rest."""
    if key in ("task",):
        return st.one_of(st.sampled_from(["arithmetic", "math", "nope"]),
                         st.fixed_dictionaries({}, optional={k: values for k in ["name", *TASK_FIELDS["arithmetic"]]}))
    if key in ("use_vllm",):
        return st.one_of(st.booleans(), values)
    if key in ("vllm_mode", "scale_rewards", "optim", "report_to", "lr_scheduler_type"):
        return st.one_of(st.sampled_from(["server", "colocate", "group", "batch", "none", "adamw_torch", "cosine",
                                          "tensorboard", "bogus", True, False]), values)
    if key == "model":
        return st.one_of(st.just("tiny"), hostile_text,
                         st.fixed_dictionaries({}, optional={k: st.one_of(st.integers(-1, 300), values)
                                                             for k in ["name", *MODEL_FIELDS_TINY]}))
    return st.one_of(numbers, st.booleans(), st.none(), values)


config_dicts = st.dictionaries(st.sampled_from(CONFIG_KEYS), st.none(), max_size=6).flatmap(
    lambda keys: st.fixed_dictionaries({k: _plausible(k) for k in keys}))


def yaml_text(data: Any, draw_bytes: bytes = b"") -> bytes:
    """YAML of ``data`` (dates and binary included); sometimes damaged by the drawn bytes."""
    try:
        text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False).encode("utf-8")
    except (yaml.YAMLError, ValueError, UnicodeEncodeError):
        text = repr(data).encode("utf-8", "replace")
    if draw_bytes:
        mode = draw_bytes[0] % 5
        if mode == 0:          # a duplicate top-level key
            first = text.split(b"\n", 1)[0]
            text = text + first + b"\n"
        elif mode == 1:        # random bytes spliced in
            pos = draw_bytes[1] % (len(text) + 1) if len(draw_bytes) > 1 else 0
            text = text[:pos] + draw_bytes[2:] + text[pos:]
        elif mode == 2:        # truncated
            text = text[: len(text) * (draw_bytes[-1] % 100) // 100]
    return text


mutations = st.one_of(st.just(b""), st.binary(min_size=1, max_size=8))


# --------------------------------------------------------------------------- specs and profiles
grid_dicts = st.dictionaries(st.sampled_from(["alpha", "learning_rate", "beta", "objective", "seed", "task.digits",
                                              "model.hidden_size", "nope", "max_steps"]),
                             st.one_of(st.lists(st.one_of(numbers, scalars), min_size=0, max_size=3), values),
                             max_size=3)
spec_dicts = st.fixed_dictionaries(
    {"name": st.one_of(st.just("fz"), hostile_text)},
    optional={"base": st.one_of(config_dicts, values), "grid": st.one_of(grid_dicts, values),
              "seeds": st.one_of(st.lists(st.integers(-1, 2**33), max_size=3), values),
              "include": st.one_of(st.lists(config_dicts, max_size=2), values),
              "exclude": st.one_of(st.lists(config_dicts, max_size=2), values),
              "description": values, "search": values, "bogus": values})
_server = st.fixed_dictionaries({}, optional={
    "gpus": st.one_of(st.integers(-1, 3), values), "port": st.one_of(st.just("auto"), st.integers(0, 70000), values),
    "args": st.one_of(st.lists(hostile_text, max_size=3), hostile_text, values),
    "env": st.one_of(st.dictionaries(st.sampled_from(["VLLM_X", "BASH_ENV", "ENV", "LD_PRELOAD", "A B", "X"]),
                                     st.one_of(hostile_text, numbers), max_size=2), values),
    "startup_timeout_s": st.one_of(numbers, values)})
vllm_servers = st.one_of(st.fixed_dictionaries({}, optional={"policy": _server, "ref": _server,
                                                            "command": st.one_of(hostile_text, st.lists(hostile_text))}),
                         values)
_export = st.builds(lambda a, b: f"ALL,{a}={b}", st.sampled_from(["BASH_ENV", "ENV", "FOO", "BASH_FUNC_x%%",
                                                                  "LD_PRELOAD", "PATH", "PYTHONPATH", "LD_LIBRARY_PATH",
                                                                  "PYTHONSTARTUP"]), hostile_text)
# the long options sbatch reads as --export-file (it accepts unambiguous prefixes)
_export_file = st.builds(lambda k, v: {k: v}, st.sampled_from(["export-file", "export_file", "export-fil", "export-f",
                                                               "export-"]), hostile_text)
profile_dicts = st.dictionaries(st.sampled_from([*PROFILE_FIELDS, "bogus"]), st.none(), max_size=6).flatmap(
    lambda keys: st.fixed_dictionaries({k: (st.one_of(st.dictionaries(hostile_text, scalars, max_size=2),
                                                      st.fixed_dictionaries({"export": _export}), _export_file)
                                            if k == "sbatch" else st.lists(hostile_text, max_size=2)
                                            if k == "setup" else st.sampled_from(["slurm", "local"])
                                            if k == "executor" else vllm_servers
                                            if k == "vllm_servers" else st.one_of(numbers, hostile_text, scalars))
                                        for k in keys}))
recipe_dicts = st.fixed_dictionaries(
    {"runs": st.one_of(st.just(["RUNS"]), st.just(["RUNS"]), st.just(["RUNS"]), values)},
    optional={"title": st.one_of(st.text(max_size=20), values),
                  "group_by": st.one_of(st.lists(st.sampled_from(["objective", "seed", "alpha", "nope"]), max_size=2),
                                        values),
                  "curves": st.one_of(st.lists(st.sampled_from(["val/acc", "train/reward", "x/y"]), max_size=2),
                                      values),
                  "select": st.one_of(st.fixed_dictionaries({}, optional={"metric": st.sampled_from(["val/acc", "x"]),
                                                                          "mode": st.sampled_from(["max", "min", "x"]),
                                                                          "report": values}), values),
                  "matched_steps": st.one_of(st.lists(st.integers(-5, 10**20), max_size=3), values),
                  "collapse": values, "kl": values, "scores": values, "compare": values, "bogus": values})


# --------------------------------------------------------------------------- damaged run dirs
def _status_damage() -> st.SearchStrategy:
    fields = {"state": st.one_of(st.sampled_from(["pending", "running", "completed", "failed"]), values),
              "attempt": st.one_of(st.integers(-1, 10**20), values), "reason": values, "job_id": values,
              "started": values, "ended": values}
    return st.one_of(st.fixed_dictionaries({}, optional=fields).map(lambda d: json.dumps(d, default=repr).encode()),
                     st.binary(max_size=20))


metric_rows = st.fixed_dictionaries(
    {"step": st.one_of(st.integers(0, 50), st.integers(-5, 10**22), values)},
    optional={"val/acc": st.one_of(st.floats(0, 1), values), "train/reward": st.one_of(st.floats(), values),
              "test/acc": st.one_of(st.floats(0, 1), values)})
metrics_damage = st.lists(st.one_of(metric_rows.map(lambda r: json.dumps(r, default=repr).encode()),
                                    st.binary(max_size=12), st.just(b'{"step": 3, "val/ac')),
                          max_size=8).map(b"\n".join)
_deep = st.integers(1, 4).map(  # 10^5 crashes pyarrow in-process: fuzz_surfaces has that case
    lambda k: b'{"step": 1, "x": ' + b"[" * 10**k + b"]" * 10**k + b"}")
run_damage = st.fixed_dictionaries({}, optional={
    "status.json": st.one_of(_status_damage(), _deep), "metrics.jsonl": st.one_of(metrics_damage, _deep),
    "config.yaml": st.one_of(config_dicts.map(lambda d: yaml_text(d)), st.binary(max_size=20)),
    "directory": st.sampled_from(["status.json", "metrics.jsonl", "config.yaml"]),
    "owner.lock": st.sampled_from(["directory", "fifo", "symlink"])})


# --------------------------------------------------------------------------- the cases
class Workspace:
    """A temp dir with a small healthy sweep (two runs) that cases copy and damage."""

    def __init__(self) -> None:
        from armorlab.core.config import resolve
        from armorlab.core.runs import RunDir

        self.root = Path(tempfile.mkdtemp(prefix="armorlab-fuzz-"))
        self.sweep = self.root / "healthy" / "sw"
        cfg = resolve({"max_steps": 20, "val_every": 10})
        for seed, acc in ((0, 0.5), (1, 0.6)):
            rd = RunDir.create(self.sweep, {**cfg, "seed": seed})
            for step in (0, 10, 20):
                rd.append_metrics(step, {"val/acc": acc + step / 100, "train/reward": step / 20, "test/acc": acc})
            rd.write_status("completed")
        self.n = 0

    def fresh(self) -> Path:
        self.n += 1
        d = self.root / f"case{self.n}"
        d.mkdir()
        return d

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def case_spec(ws: Workspace, spec: dict, mutation: bytes, profile: dict | None) -> tuple[list[str], str]:
    d = ws.fresh()
    (d / "spec.yaml").write_bytes(yaml_text(spec, mutation))
    argv = ["sweep", str(d / "spec.yaml"), "--dry-run", "--root", str(d / "runs")]
    if profile is not None:
        (d / "profile.yaml").write_bytes(yaml_text(profile))
        argv += ["--profile", str(d / "profile.yaml")]
    return argv, f"spec={spec!r:.600} mutation={mutation!r} profile={profile!r:.400}"


def case_recipe(ws: Workspace, recipe: dict, mutation: bytes) -> tuple[list[str], str]:
    d = ws.fresh()
    recipe = {**recipe, "out": str(d / "report")}
    if recipe.get("runs") == ["RUNS"]:
        recipe["runs"] = [str(ws.sweep)]
    (d / "recipe.yaml").write_bytes(yaml_text(recipe, mutation))
    return ["report", str(d / "recipe.yaml")], f"recipe={recipe!r:.800} mutation={mutation!r}"


def case_run_dir(ws: Workspace, damage: dict, command: str) -> tuple[list[str], str]:
    d = ws.fresh()
    sweep = d / "sw"
    shutil.copytree(ws.sweep, sweep)
    victim = sorted(p for p in sweep.iterdir() if p.is_dir())[0]
    for name, content in damage.items():
        if name == "directory":
            (victim / content).unlink(missing_ok=True)
            (victim / content).mkdir(exist_ok=True)
        elif name == "owner.lock":  # with a "running" status, so that status looks for its owner
            lock = victim / "owner.lock"
            if content == "directory":
                lock.mkdir()
            elif content == "fifo":
                os.mkfifo(lock)
            else:
                lock.symlink_to(victim / "config.yaml")
            status = victim / "status.json"
            if status.is_file() and not status.is_symlink():
                status.write_text(json.dumps({"state": "running", "attempt": 1}))
        elif (victim / name).is_file() or not (victim / name).exists():
            (victim / name).write_bytes(content)
    argv = ["status", str(sweep)] if command == "status" else ["report", str(sweep), "--out", str(d / "rep"),
                                                               "--no-cache"]
    return argv, f"{command} damage={damage!r:.1200}"


# --------------------------------------------------------------------------- storage URLs (issue 41 §2)
# A password in each form a storage URL can carry it; generated, then checked never to be shown.
_PW_CHARS = st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="\\'")
storage_passwords = st.text(_PW_CHARS, min_size=6, max_size=16).map(lambda p: "Pw" + p)
STORAGE_FORMS = ("userinfo", "userinfo raw @", "user@server", "?password=", "?PASSWORD=", "?sslpassword=",
                 "conninfo", "conninfo quoted")


def storage_url(form: str, password: str) -> str:
    """``password`` written into a storage URL (or libpq string) as ``form`` does."""
    from urllib.parse import quote

    enc = quote(password, safe="")
    if form == "userinfo":
        return f"postgresql://ann:{enc}@db.example:5432/x"
    if form == "userinfo raw @":  # unencoded '@' is read as far as the '@' before the host
        raw = password.replace("/", "").replace("?", "").replace("#", "").replace("%", "") + "@x"
        return f"postgresql://ann:{raw}@db.example:5432/x"
    if form == "user@server":
        return f"postgresql://ann@srv:{enc}@db.example/x"
    if form.startswith("?"):
        return f"postgresql://ann@db.example/x?sslmode=require&{form[1:-1]}={enc}"
    value = password.replace(" ", "") if form == "conninfo" else password
    if form == "conninfo quoted" or any(c in value for c in " '\\"):
        value = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return f"host=db.example dbname=x user=ann password={value} sslmode=require"


def storage_secret_shown(form: str, password: str) -> str | None:
    """Where a generated URL's password is shown (its redacted form, an error scrubbed of it, the URL
    stored), or None: it never is."""
    from urllib.parse import quote

    from armorlab.tune.secrets import redact, scrub, secrets_of, split_password

    url = storage_url(form, password)
    secret = secrets_of(url)
    if not secret:
        return f"not found in {url!r}"
    spellings = {s for x in secret for s in (x, quote(x, safe=""))}
    shown = {"redact": redact(url), "scrub": scrub(f"could not open {url}", url)}
    if form not in ("?sslpassword=", "conninfo", "conninfo quoted"):  # those are refused, never stored
        shown["stored"] = split_password(url)[0]
    for where, text in shown.items():
        if any(s in text for s in spellings if len(s) >= 6):
            return f"{where}: {text!r}"
    return None


# --------------------------------------------------------------------------- importers (issue 41)
# rows of another library's log with any step and any value: imported in-process, each case ends as a
# run (0), an ArmorLabError (2), a traceback, or "wrong": a step on the curve that no row gave as a whole
# number in [0, 2**63) (1e300 once became -2**63)
_ANY_NUMBER = st.one_of(st.integers(-2**70, 2**70), st.floats(), st.booleans())
_STEPS = st.one_of(st.integers(0, 50), _ANY_NUMBER, st.none(), st.text(max_size=3))
_VALUES = st.one_of(st.floats(allow_nan=False, allow_infinity=False), _ANY_NUMBER, st.none(), st.text(max_size=4),
                    st.lists(st.integers(), max_size=2), st.recursive(st.none(), lambda c: st.lists(c, max_size=1),
                                                                       max_leaves=3))
_NAMES = st.sampled_from(["train/loss", "train/global_step", "actor/kl_loss", "x"])
importer_rows = st.lists(st.tuples(_STEPS, st.dictionaries(_NAMES, _VALUES, max_size=3)), min_size=1, max_size=10)
importer_kinds = st.sampled_from(["verl", "trackio"])


def _whole_steps(values: list[Any]) -> set[int]:
    out = set()
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v == int(v) and \
                0 <= int(v) < 2**63:
            out.add(int(v))
    return out


def case_importer(ws: Workspace, kind: str, rows: list[tuple[Any, dict]], tail: bytes) -> tuple[Any, str]:
    """``rows`` (step, metrics) as a verl file log (+ ``tail``, raw bytes) or a trackio project, imported."""
    from importer_writers import write_trackio_db

    from armorlab.analysis.importers import trackio_db, verl
    from armorlab.errors import ArmorLabError

    d = ws.fresh()
    case = f"{kind} {rows!r} + {tail!r}"
    if kind == "verl":
        path = d / "exp.jsonl"
        path.write_bytes(b"".join(json.dumps({"step": s, "data": m}).encode() + b"\n" for s, m in rows) + tail)
        allowed = _whole_steps([s for s, _ in rows if not isinstance(s, float)])
    else:
        def sql_step(s: Any) -> Any:  # SQLite stores int64; a larger int as the text a column would keep
            return str(s) if isinstance(s, int) and not -2**63 <= s < 2**63 else s
        path = write_trackio_db(d / "proj.db", [("r", sql_step(s), "NULL") for s, _ in rows])
        import sqlite3
        con = sqlite3.connect(path)
        con.executemany("UPDATE metrics SET metrics = ? WHERE id = ?",
                        [(json.dumps(m).encode() + tail, i + 1) for i, (_, m) in enumerate(rows)])
        con.commit()
        con.close()
        # SQLite stores a bool as the int it is
        allowed = _whole_steps([int(s) if isinstance(s, bool) else s for s, _ in rows] +
                               [m.get("train/global_step") for _, m in rows])
    try:
        with _alarm(HANG_S):
            runs = [verl.read(path)] if kind == "verl" else trackio_db.read_project(path)
    except ArmorLabError:
        return USER_ERROR, case
    except _Hang:
        return "hang", case
    except BaseException:  # noqa: BLE001 - the point: anything else is a traceback
        return "traceback: " + traceback.format_exc(limit=-3), case
    for run in runs:
        bad = set(run.table.column("step").to_pylist()) - allowed
        if bad:
            return f"wrong: steps {sorted(bad)[:3]} on the curve", case
    return OK, case
