"""Files written by the libraries themselves, for the importer tests (armorlab.analysis.importers).

Each writer uses the library's own public writing path: TRL's GRPOTrainer (trainer_state.json,
TensorBoard through transformers' callback, trackio), transformers' TrainerState, wandb in offline
mode, torch's and tensorboard's SummaryWriter / EventFileWriter, trackio, and verl's own
``FileLogger`` (verl/utils/tracking.py) where verl's source is installed (``make test`` puts it,
without its GPU dependencies, under ``$VENV/share/verl``). The libraries that keep global state or
read their settings at import (wandb's service process, trackio's TRACKIO_DIR) run in a
subprocess: ``python tests/importer_writers.py KIND OUT_DIR SPEC.json``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ENV = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false",
       "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true", "WANDB_CONSOLE": "off",
       "WANDB_DISABLE_CODE": "true", "TRACKIO_DISABLE_TELEMETRY": "1"}


def run_writer(kind: str, out: Path, spec: dict[str, Any] | None = None, timeout: float = 600) -> None:
    """Write ``kind`` files into ``out`` in a fresh interpreter."""
    out.mkdir(parents=True, exist_ok=True)
    spec_file = out.parent / f".{out.name}-{kind}-spec.json"
    spec_file.write_text(json.dumps(spec or {}))
    env = {**os.environ, **ENV, "TRACKIO_DIR": str(out), "WANDB_DIR": str(out),
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(Path(__file__)), kind, str(out), str(spec_file)], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=str(out))
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} writer failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


# --------------------------------------------------------------------------- in a subprocess
def _trl(out: Path, spec: dict[str, Any]) -> None:
    """A 3-step GRPOTrainer run on the tiny model, report_to TensorBoard and trackio, a checkpoint
    per step, an evaluation every 2 steps, and save_state() at the end (the summary row)."""
    import torch

    torch.set_num_threads(1)
    from trainer_support import model_cache, resolved
    from trl import GRPOConfig, GRPOTrainer

    from armorlab.tasks import build_task
    from armorlab.train.models import prepare_model

    cfg = resolved()
    task = build_task(cfg["task"])
    path = prepare_model(cfg["model"], cfg["task"], cache_dir=model_cache())
    args = GRPOConfig(output_dir=str(out / "grpo"), max_steps=3, per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, logging_steps=1, save_steps=1, eval_strategy="steps", eval_steps=2,
                      per_device_eval_batch_size=8, report_to=["tensorboard", "trackio"], use_cpu=True,
                      seed=spec.get("seed", 0), beta=0.04, project="trl-import", run_name="grpo-seed0")
    trainer = GRPOTrainer(model=str(path), reward_funcs=task.reward_funcs, args=args, train_dataset=task.train,
                          eval_dataset=task.val.select(range(4)))
    trainer.train()
    trainer.save_state()


def _wandb(out: Path, spec: dict[str, Any]) -> None:
    import wandb

    for run_spec in spec["runs"]:
        run = wandb.init(project=run_spec.get("project", "import-test"), name=run_spec["name"],
                         config=run_spec.get("config", {}), dir=str(out), mode="offline",
                         group=run_spec.get("group"))
        if run_spec.get("define_step"):
            for key, metric in run_spec["define_step"].items():
                run.define_metric(metric)
                run.define_metric(key, step_metric=metric)
        for row in run_spec["rows"]:
            if "step" in row:
                run.log(row["data"], step=row["step"])
            else:
                run.log(row["data"])
        run.finish(exit_code=run_spec.get("exit_code", 0))


def _trackio(out: Path, spec: dict[str, Any]) -> None:
    import trackio

    for run_spec in spec["runs"]:
        trackio.init(project=spec.get("project", "import-test"), name=run_spec["name"],
                     config=run_spec.get("config", {}))
        for row in run_spec["rows"]:
            trackio.log(row["data"], step=row.get("step"))
        trackio.finish()


WRITERS = {"trl": _trl, "wandb": _wandb, "trackio": _trackio}


# --------------------------------------------------------------------------- in this process
def verl_tracking():
    """verl's own verl/utils/tracking.py, loaded by path (its package __init__ imports ray and
    torch; tracking.py itself needs only orjson and packaging); None when verl is not installed."""
    candidates = [Path(sys.prefix) / "share" / "verl" / "verl" / "utils" / "tracking.py"]
    spec = importlib.util.find_spec("verl") if importlib.util.find_spec("verl") is not None else None
    if spec is not None and spec.submodule_search_locations:
        candidates.insert(0, Path(spec.submodule_search_locations[0]) / "utils" / "tracking.py")
    for path in candidates:
        if path.is_file():
            mod_spec = importlib.util.spec_from_file_location("_verl_tracking", path)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
            return module
    return None


def write_verl_jsonl(root: Path, project: str, experiment: str, rows: list[tuple[int, dict[str, float]]]) -> Path:
    """Lines as verl's FileLogger writes them: its own class when verl is installed. Else the same
    bytes by its documented format — verl/utils/tracking.py (v0.9.1) FileLogger:
        directory = os.path.join(root_path, self.project_name)
        self.filepath = os.path.join(directory, f"{self.experiment_name}.jsonl")
        self.fp = open(self.filepath, "wb", buffering=0)
        data = {"step": step, "data": data}
        self.fp.write(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY) + b"\\n")
    """
    tracking = verl_tracking()
    os.environ["VERL_FILE_LOGGER_ROOT"] = str(root)
    os.environ.pop("VERL_FILE_LOGGER_PATH", None)
    if tracking is not None:
        logger = tracking.FileLogger(project, experiment)
        for step, data in rows:
            logger.log(data=data, step=step)
        logger.finish()
        return Path(logger.filepath)
    path = root / project / f"{experiment}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        for step, data in rows:
            fh.write(json.dumps({"step": step, "data": data}, separators=(",", ":")).encode() + b"\n")
    return path


def write_verl_dump(dump_dir: Path, step: int, rows: list[dict[str, Any]]) -> Path:
    """One validation dump as verl's RayPPOTrainer._write_generations writes it
    (verl/trainer/ppo/ray_trainer.py, v0.9.1; that module imports ray and torch, so its lines are
    followed here):
        filename = os.path.join(dump_path, f"{global_steps}.jsonl")
        base_data = {"input": inputs, "output": outputs, "gts": gts, "score": scores,
                     "step": [global_steps] * n}
        for k, v in reward_extra_infos_dict.items():
            if len(v) == n: base_data[k] = v
        ... f.write(json.dumps(entry, ensure_ascii=False, default=str) + "\\n")
    ``rows``: dicts with input, output, gts, score and any extra keys (acc, ...)."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    path = dump_dir / f"{step}.jsonl"
    with open(path, "w") as f:
        for r in rows:
            entry = {"input": r["input"], "output": r.get("output", ""), "gts": r.get("gts"), "score": r["score"],
                     "step": step, **{k: v for k, v in r.items() if k not in ("input", "output", "gts", "score")}}
            f.write(json.dumps(entry, ensure_ascii=False, default=str) + "\n")
    return path


def write_tensorboard(logdir: Path, rows: list[tuple[int, dict[str, float]]]) -> Path:
    """torch's SummaryWriter (what verl's and OpenRLHF's TensorBoard loggers use): add_scalar per value."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(logdir))
    for step, data in rows:
        for k, v in data.items():
            writer.add_scalar(k, v, step)
    writer.close()
    return logdir


def write_trainer_state(out_dir: Path, log_history: list[dict[str, Any]], *, max_steps: int,
                        checkpoint: int | None = None) -> Path:
    """transformers' own TrainerState.save_to_json, as Trainer._save_checkpoint calls it."""
    from transformers import TrainerState

    state = TrainerState(global_step=max(r["step"] for r in log_history), max_steps=max_steps,
                         log_history=log_history, logging_steps=1)
    target = out_dir / f"checkpoint-{checkpoint}" if checkpoint is not None else out_dir
    target.mkdir(parents=True, exist_ok=True)
    state.save_to_json(str(target / "trainer_state.json"))
    return target / "trainer_state.json"


# --------------------------------------------------------------------------- damaged files, byte by byte
def write_trackio_db(path: Path, rows: list[tuple], configs: list[tuple] = ()) -> Path:
    """A trackio project file as its schema stands (metrics, configs by run_name), ``rows`` (run_name, step,
    metrics as an SQL expression) of any type: SQLite columns take what they are given."""
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("CREATE TABLE metrics (id INTEGER PRIMARY KEY, run_name TEXT, step, metrics)")
    con.execute("CREATE TABLE configs (run_name TEXT, config TEXT)")
    for name, step, metrics in rows:
        con.execute(f"INSERT INTO metrics (run_name, step, metrics) VALUES (?, ?, {metrics})", (name, step))
    con.executemany("INSERT INTO configs VALUES (?, ?)", configs)
    con.commit()
    con.close()
    return path


def write_wandb_records(path: Path, records: list[bytes]) -> Path:
    """A .wandb transaction log (LevelDB log format: header, then one FULL chunk per record, CRC32 seeded
    with the chunk type) of records small enough for one 32 KiB block."""
    import zlib

    from armorlab.analysis.importers import wandb_local as W

    out = bytearray(W.HEADER.pack(W.IDENT, W.MAGIC, W.VERSION))
    for rec in records:
        out += W.CHUNK.pack(zlib.crc32(rec, zlib.crc32(bytes((W.FULL,)))), len(rec), W.FULL) + rec
    assert len(out) < W.BLOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(out))
    return path


def pb_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (number < 16), whatever its bytes are."""
    size, n = b"", len(payload)
    while True:
        size += bytes(((n & 0x7F) | (0x80 if n >> 7 else 0),))
        n >>= 7
        if not n:
            break
    return bytes(((number << 3) | 2,)) + size + payload


if __name__ == "__main__":
    kind, out, spec_file = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    WRITERS[kind](out, json.loads(spec_file.read_text()))
