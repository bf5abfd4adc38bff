"""The sbatch script: submitit's, checked here before anything reaches ``sbatch``.

A ``#SBATCH`` line is a comment to bash: ``shlex.quote`` keeps a value in one shell word but not
in one *line*. A newline in a partition, an sbatch option or the sweep's path would end the
comment and run the rest as shell code when the job starts. Two defences, both needed:

1. every value that reaches the script (profile fields, sbatch options, the sweep dir's path, the
   job name, the python command) is refused when it holds a control character (``script_value``);
2. the rendered script is checked line by line against the shape submitit writes
   (``check_script``): shebang, ``# Parameters`` + only ``#SBATCH --opt[=value]`` lines, the
   profile's setup lines verbatim, then exactly one command line. Anything else refuses the submit.

``--dry-run`` prints the script without importing submitit (a third of a dry run's start-up):
``render_script`` writes the text submitit's ``_make_sbatch_string`` writes for the parameters a
profile produces (tests hold the two equal, for any profile); a parameter it does not model makes
it answer None, and submitit renders it. An array is queued with that same rendering, without
submitit (armorlab.sweeps.executors); where submitit renders (a single job, an unmodelled
parameter) `armorlab sweep` compares its script with render_script's and warns when an upgraded
submitit writes something else. An array's command line is armorlab's array entry
(armorlab.sweeps.array_task: one file per array), a single job's submitit's.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from armorlab.core.checks import Invalid
from armorlab.errors import ArmorLabError

_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
_SBATCH_LINE = re.compile(r"#SBATCH --[A-Za-z0-9][A-Za-z0-9_-]*(=\S.*)?")


def script_value(v: Any) -> Any:
    """A check (armorlab.core.checks style): ``v`` unchanged, unless its text holds a control character
    (newline, CR, NUL, tab, …), which could end a ``#SBATCH`` line or a shell line."""
    m = _CONTROL.search(str(v))
    if m:
        raise Invalid(f"must not contain control characters (found {m.group()!r}): it would end a line "
                      "of the sbatch script")
    return v


def check_script(text: str, setup: Sequence[str] = ()) -> None:
    """Refuse a rendered sbatch script whose lines are not the shape submitit writes."""
    def bad(why: str, line: str | None = None) -> ArmorLabError:
        return ArmorLabError(f"refusing to submit: the sbatch script {why}", key="sbatch script line",
                             value=line)

    stray = _CONTROL.search(text.replace("\n", ""))
    if stray:
        raise bad(f"contains the control character {stray.group()!r}")
    lines = text.split("\n")
    if lines[:3] != ["#!/bin/bash", "", "# Parameters"]:
        raise bad("does not start with submitit's header", "\n".join(lines[:3]))
    i = 3
    while i < len(lines) and lines[i] != "":
        if not _SBATCH_LINE.fullmatch(lines[i]):
            raise bad("has a line in its #SBATCH block that is not an #SBATCH option", lines[i])
        i += 1
    tail = lines[i:]
    head = ["", "# setup", *setup] if setup else []
    if tail[:len(head)] != head:
        raise bad("setup block differs from the profile's setup lines", "\n".join(tail[:len(head)]))
    tail = tail[len(head):]
    if len(tail) != 5 or tail[:3] != ["", "# command", "export SUBMITIT_EXECUTOR=slurm"] or tail[4] != "":
        raise bad("command block is not one command line", "\n".join(tail))


# submitit's parameters that are no #SBATCH line of their own, and the defaults of those that are
# (submitit.slurm.slurm._make_sbatch_string's signature, submitit 1.5)
_NOT_SBATCH = {"array_parallelism": 256, "additional_parameters": None, "setup": None, "signal_delay_s": 90,
               "stderr_to_stdout": False, "map_count": None}
_SBATCH_DEFAULTS = {"job_name": "submitit", "time": 5, "nodes": 1, "wckey": "submitit"}
_SBATCH_MODELLED = {*_SBATCH_DEFAULTS, "partition", "account", "qos", "ntasks_per_node", "cpus_per_task",
                    "gpus_per_node", "mem"}


def submit_command(folder: Path, python: str | None, *, array: bool = False) -> str:
    """The command line each task runs: submitit's SlurmExecutor's (its ``_submitit_command_str``)
    for a single job, armorlab's array entry (armorlab.sweeps.array_task) for a job array."""
    python = shlex.quote(sys.executable) if python is None else python
    module = "armorlab.sweeps.array_task" if array else "submitit.core._submit"
    return " ".join([python, f"-u -m {module}", shlex.quote(str(folder))])


def executor_folder(folder: str | os.PathLike) -> Path:
    """The folder as submitit's executors hold it."""
    return Path(folder).expanduser().absolute()


def render_script(folder: str | os.PathLike, params: Mapping[str, Any], *, python: str | None = None,
                  map_count: int | None = None) -> str | None:
    """The sbatch script submitit writes for ``params`` (``Profile.submitit_parameters``), an array
    of ``map_count`` tasks when given; None when ``params`` hold a key this rendering does not model."""
    if not set(params) <= {*_NOT_SBATCH, *_SBATCH_MODELLED}:
        return None
    opt = {**_NOT_SBATCH, **{k: v for k, v in params.items() if k in _NOT_SBATCH}}
    if map_count is not None:
        opt["map_count"] = map_count
    sbatch = {**_SBATCH_DEFAULTS, **{k: v for k, v in params.items() if k in _SBATCH_MODELLED and v is not None}}
    sbatch["signal"] = f"{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}@{opt['signal_delay_s']}"
    folder = executor_folder(folder)
    stdout, stderr = str(folder / "%j_%t_log.out"), str(folder / "%j_%t_log.err")
    n = opt["map_count"]
    if n is not None:
        sbatch["array"] = f"0-{n - 1}%{min(n, opt['array_parallelism'])}"
        stdout, stderr = stdout.replace("%j", "%A_%a"), stderr.replace("%j", "%A_%a")
    sbatch["output"] = stdout.replace("%t", "0")
    if not opt["stderr_to_stdout"]:
        sbatch["error"] = stderr.replace("%t", "0")
    sbatch["open-mode"] = "append"
    sbatch.update(opt["additional_parameters"] or {})
    lines = ["#!/bin/bash", "", "# Parameters"]
    for key in sorted(sbatch):
        value = sbatch[key]
        flag = key.replace("_", "-")
        lines.append(f"#SBATCH --{flag}" if value is True else f"#SBATCH --{flag}={shlex.quote(str(value))}")
    if opt["setup"] is not None:
        lines += ["", "# setup", *opt["setup"]]
    srun = ["srun", "--unbuffered", "--output", stdout, *([] if opt["stderr_to_stdout"] else ["--error", stderr])]
    command = " ".join(shlex.quote(a) for a in srun) + " " + submit_command(folder, python, array=n is not None)
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", command, ""]
    return "\n".join(lines)


def check_names(folder: str | os.PathLike, job_name: str) -> None:
    """The sweep dir's path and the job name reach the script: no control character in either."""
    for key, value in (("--root (the sweep dir's path)", Path(folder).absolute()), ("name", job_name)):
        try:
            script_value(value)
        except Invalid as exc:
            raise ArmorLabError(str(exc), key=key, value=str(value)) from None


def checked_executor(folder: Path, profile: Any, *, job_name: str, dry_run: bool = False) -> Any:
    """A submitit SlurmExecutor for ``profile`` whose every rendered script passes ``check_script``
    (also in ``--dry-run``, which renders without submitting)."""
    import submitit

    where = str(profile.path) if getattr(profile, "path", None) else None
    check_names(folder, job_name)

    class CheckedSlurmExecutor(submitit.SlurmExecutor):
        def _make_submission_file_text(self, command: str, uid: str) -> str:
            text = super()._make_submission_file_text(command, uid)
            check_script(text, profile.setup)
            return text

        if dry_run:
            @classmethod
            def affinity(cls) -> int:
                return 1

            def _submit_command(self, command: str) -> Any:
                raise RuntimeError("dry run: nothing is submitted")

    try:
        ex = CheckedSlurmExecutor(folder=folder, max_num_timeout=profile.max_num_timeout, python=profile.python)
    except RuntimeError as exc:  # submitit: no srun on this machine
        raise ArmorLabError(f"Slurm is not available here ({exc}); use --executor local",
                            key="--executor", value="slurm") from None
    try:
        ex.update_parameters(**profile.submitit_parameters(job_name=job_name))
    except ValueError as exc:
        raise ArmorLabError(f"profile does not translate to sbatch options: {exc}", file=where) from None
    return ex
