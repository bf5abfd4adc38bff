"""A stand-in for `armorlab train --run-dir DIR` that follows the trainer's process contract (C3)
without torch, for tests of the sweep layer itself (signals, requeue, chunking, safety).

Metrics are a pure function of (seed, step), so an interrupted-and-resumed run must end with
exactly the metrics of an uninterrupted one. Knobs (env): ARMORLAB_STANDIN_STEP_S = seconds per
step (default 0.02); ARMORLAB_STANDIN_HOLD_AT = a step at which the run parks until it is stopped
(a signal or a stop request), so a test that interrupts it mid-run never races a fast finish on a busy
machine. A run whose model name is neither "tiny" nor a directory holding a file ``standin-model``
fails like a missing model would. ARMORLAB_STANDIN_VAL_LEVELS = JSON {objective: [level, spread]}
makes every val/acc of a run of that objective ``val_level(seed, level, spread)`` (flat curves whose
final level is known exactly: tests of verdicts). ARMORLAB_STANDIN_VAL_STEPS = JSON [[from_step, value],
...] makes val/acc a step function of the step (each value from its step on; val/n = 400 beside it),
and a run with ``stop_on_collapse`` then stops as the trainer does (armorlab.stats.stopping decides;
selected.json by armorlab.stats.select's rule over its checkpoints; status ``stopped``). A run that continues from another (``init_from``) records the
state of that run when it started in ``standin_parent.json``. Started by a job with vLLM servers ($ARMORLAB_VLLM_ENDPOINTS), it records what it got
in ``standin_trainer.json`` and fails like TRL's client would when the policy server stops answering.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from armorlab.core.runs import RunDir
from armorlab.core.schedule import config_per_rollout, planned_evals, rollout_at
from armorlab.core.stop_on_collapse import level_evals, rollouts_per_eval
from armorlab.stats.select import select_checkpoints
from armorlab.stats.stopping import CollapseWatch
from armorlab.vllm.endpoints import read_endpoints


def answers(port: int) -> bool:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def metric(seed: int, step: int, salt: int) -> float:
    return ((seed * 7919 + step * 104729 + salt * 31) % 1000) / 1000.0


def val_level(seed: int, level: float, spread: float) -> float:
    """A run's flat val/acc under ARMORLAB_STANDIN_VAL_LEVELS: the level, moved by spread × (u − ½)
    with u = metric(seed, 0, 1) in [0, 1)."""
    return level + spread * (metric(seed, 0, 1) - 0.5)


def stop_watch(cfg: dict) -> CollapseWatch | None:
    stop = cfg.get("stop_on_collapse")
    if stop is None:
        return None
    return CollapseWatch(patience=level_evals(stop["patience"], rollouts_per_eval(cfg)), delta=stop["delta"],
                         alpha=stop["alpha"], horizon=planned_evals(cfg))


def keep_peak(rd: RunDir, per) -> None:
    """selected.json as the trainer's keeper writes it (its rule, over the saved checkpoints)."""
    evals = [(r["step"], r["val/acc"]) for r in rd.read_metrics() if r.get("val/acc") is not None]
    saved = [int(p.name.split("-")[1]) for p in rd.checkpoints()]
    pick = select_checkpoints([s for s, _ in evals], [v for _, v in evals], eligible=saved)[0]
    (rd.path / "selected.json").write_text(json.dumps({
        "rule": "standin", "metric": "val/acc", "mode": "max", "step": int(pick.step), "rollout": rollout_at(int(pick.step), per),
        "value": pick.level, "checkpoint": f"checkpoints/checkpoint-{int(pick.step)}"}))


def job_id() -> str | None:
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("ARMORLAB_JOB_ID")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args()
    rd = RunDir(args.run_dir)
    if rd.acquire_owner() is None:  # contract: one trainer per run dir (held until exit)
        print(f"another live process owns {rd.path}", file=sys.stderr)
        return 73
    cfg = rd.read_config()
    stop = {"signal": None}

    def on_signal(signum, frame):
        stop["signal"] = signum

    signal.signal(signal.SIGUSR1, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    rd.write_status("running", job_id=job_id())
    endpoints = read_endpoints()
    if endpoints:
        (rd.path / "standin_trainer.json").write_text(json.dumps({
            "endpoints": endpoints, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "answering": {k: answers(v) for k, v in endpoints.items() if k.endswith("_port")}}))
    if cfg.get("init_from"):  # what a continuing run found when it started (the real one needs it completed)
        parent = RunDir(rd.path.parent.parent / cfg["init_from"]["run"])
        (rd.path / "standin_parent.json").write_text(json.dumps({**parent.read_status(), "at": time.time()}))
    if cfg["model"]["name"] != "tiny" and not (Path(cfg["model"]["name"]) / "standin-model").is_file():
        rd.write_status("failed", reason=f"cannot load model {cfg['model']['name']!r}")
        return 1
    seed, max_steps = cfg["seed"], cfg["max_steps"]
    levels = json.loads(os.environ.get("ARMORLAB_STANDIN_VAL_LEVELS") or "{}")
    pieces = json.loads(os.environ.get("ARMORLAB_STANDIN_VAL_STEPS") or "[]")
    if pieces:
        def val(step: int) -> float:
            return [v for at, v in pieces if at <= step][-1]
    elif cfg.get("objective") in levels:
        flat = val_level(seed, *levels[cfg["objective"]])

        def val(step: int) -> float:
            return flat
    else:
        def val(step: int) -> float:
            return metric(seed, step, 1)
    val_every, save_steps = cfg["val_every"], cfg.get("save_steps") or max_steps
    last = rd.last_checkpoint()
    step = json.loads((last / "state.json").read_text())["step"] if last else 0
    watch, per = stop_watch(cfg), config_per_rollout(cfg) or 1
    if step == 0 and val_every:
        rd.append_metrics(0, {"val/acc": val(0), **({"val/n": 400.0} if pieces else {})})
        if watch is not None:
            watch.observe(0, val(0), 400)

    def save(at: int) -> None:
        ck = rd.checkpoints_dir / f"checkpoint-{at}"
        ck.mkdir(parents=True, exist_ok=True)
        (ck / "state.json").write_text(json.dumps({"step": at}))

    step_s = float(os.environ.get("ARMORLAB_STANDIN_STEP_S", "0.02"))
    hold_at = int(os.environ.get("ARMORLAB_STANDIN_HOLD_AT", "-1"))
    request = Path(rd.path / "stop_request")
    while step < max_steps:
        time.sleep(step_s)
        if "vllm_server_port" in endpoints and not answers(endpoints["vllm_server_port"]):
            rd.write_status("failed", reason="ConnectionError: the vLLM server does not answer")
            return 1
        step += 1
        row = {"train/reward": metric(seed, step, 0)}
        if val_every and step % val_every == 0:
            row["val/acc"] = val(step)
            if pieces:
                row["val/n"] = 400.0
        rd.append_metrics(step, row)
        if step % save_steps == 0:
            save(step)
        if watch is not None and "val/acc" in row and watch.observe(rollout_at(step, per), row["val/acc"], 400):
            keep_peak(rd, per)
            rd.write_status("stopped", reason=watch.stop.reason)
            return 0
        while step == hold_at and stop["signal"] is None and not request.exists():
            time.sleep(0.01)
        if stop["signal"] is not None and step < max_steps:
            save(step)
            rd.write_status("pending", reason=f"preempted at step {step}")
            return 75
        if request.exists():
            reason = json.loads(request.read_text()).get("reason", "")
            rd.write_status("completed", reason=f"stopped at step {step}: {reason}")
            return 0
    rd.write_status("completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
