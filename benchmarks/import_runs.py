"""Importer speed (armorlab.analysis.importers): R runs × S steps × T metrics (default 20 × 20,000 × 30)
read through each importer, against the bare parse of the same files — what any reader must at
least do:

    verl JSONL        json.loads of every line
    trainer_state     json.loads of each trainer_state.json
    trackio           json.loads of every row's metrics text (after the same SELECT)
    W&B               the LevelDB framing + Record.FromString of every record (wandb's protobufs), and
                      each history item's name and value text read (protobuf decodes a field when it is
                      read, where json.loads hands over every value); parse_only: without that reading
    TensorBoard       the TFRecord framing + Event.FromString of every record (tensorboard's protobufs),
                      and each scalar's step, tag and value read; parse_only: without that reading

and, for TensorBoard, against what a user would run instead: tbparse's SummaryReader and
TensorBoard's EventAccumulator keeping every point (size_guidance 0 for scalars and tensors; both
check each record's CRC-32C in pure Python, so they are timed on the first --peer-runs runs and
compared with the importer on the same runs).

Each importer is timed twice: the importer alone (importers.read: files → ImportedRun tables) and
``load`` (the RunSet a report reads, cache off). One run of each format is written by the library
itself (verl's FileLogger where verl's source is installed, transformers' TrainerState, trackio,
wandb offline, tensorboard's EventFileWriter) and copied R times. Times are best-of --repeats,
importer and peer measured in alternation; ratios > 1 mean the importer is slower. The machine's
load (os.getloadavg) is printed with them.

    python benchmarks/import_runs.py [--runs 20 --steps 20000 --tags 30 --repeats 3 --peer-runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

VERL_NAMES = ["critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean", "critic/advantages/mean",
              "actor/entropy", "actor/kl_loss", "actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_lower",
              "actor/pg_loss", "actor/grad_norm", "actor/lr", "response_length/mean", "response_length/max",
              "response_length/min", "response_length/clip_ratio", "prompt_length/mean", "training/epoch",
              "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv", "timing_s/update_actor",
              "timing_s/step", "perf/throughput", "perf/total_num_tokens", "perf/max_memory_allocated_gb",
              "val-core/openai/gsm8k/acc/mean@4", "val-core/openai/gsm8k/acc/best@4/mean"]
TRL_NAMES = ["reward", "reward_std", "frac_reward_zero_std", "rewards/accuracy/mean", "rewards/accuracy/std",
             "rewards/format/mean", "rewards/format/std", "completions/mean_length", "completions/min_length",
             "completions/max_length", "completions/clipped_ratio", "completions/mean_terminated_length",
             "completions/min_terminated_length", "completions/max_terminated_length", "entropy", "kl",
             "clip_ratio/low_mean", "clip_ratio/low_min", "clip_ratio/high_mean", "clip_ratio/high_max",
             "clip_ratio/region_mean", "loss", "grad_norm", "learning_rate", "num_tokens", "step_time", "epoch",
             "eval_reward", "eval_completions/mean_length", "eval_entropy"]


def names(base: list[str], tags: int) -> list[str]:
    return (base + [f"extra/metric_{i}" for i in range(max(0, tags - len(base)))])[:tags]


def value(step: int, j: int) -> float:
    return ((step * 7919 + j * 104729) % 10007) / 10007.0


# --------------------------------------------------------------------------- one run per format
WRITER = r'''
import json, sys, os
kind, out, steps, keys = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
def value(step, j): return ((step * 7919 + j * 104729) % 10007) / 10007.0
if kind == "wandb":
    import wandb
    run = wandb.init(project="bench", name="run", dir=out, mode="offline", config={"actor_rollout_ref": {"actor": {"kl_loss_type": "low_var_kl"}}})
    for s in range(1, steps + 1):
        run.log({k: value(s, j) for j, k in enumerate(keys)}, step=s)
    run.finish()
elif kind == "trackio":
    import trackio
    trackio.init(project="bench", name="run", config={"actor_rollout_ref": {"actor": {"kl_loss_type": "low_var_kl"}}})
    for s in range(1, steps + 1):
        trackio.log({k: value(s, j) for j, k in enumerate(keys)}, step=s)
    trackio.finish()
'''


def write_one(kind: str, root: Path, steps: int, tags: int) -> Path:
    """One run of ``kind`` written by its library; the path the importer reads."""
    import importer_writers as W

    root.mkdir(parents=True, exist_ok=True)
    if kind == "verl":
        keys = names(VERL_NAMES, tags)
        return W.write_verl_jsonl(root, "bench", "run", [(s, {k: value(s, j) for j, k in enumerate(keys)})
                                                         for s in range(1, steps + 1)])
    if kind == "trl":
        keys = names(TRL_NAMES, tags)
        W.write_trainer_state(root / "run", [{"step": s, **{k: value(s, j) for j, k in enumerate(keys)}}
                                             for s in range(1, steps + 1)], max_steps=steps, checkpoint=steps)
        return root / "run"
    if kind == "tensorboard":
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        keys = names(VERL_NAMES, tags)
        writer = EventFileWriter(str(root / "run"), max_queue_size=100_000, flush_secs=3600)
        for s in range(1, steps + 1):  # what SummaryWriter.add_scalar does per value, without its checks
            for j, k in enumerate(keys):
                writer.add_event(event_pb2.Event(step=s, wall_time=1.0e9 + s, summary=summary_pb2.Summary(
                    value=[summary_pb2.Summary.Value(tag=k, simple_value=value(s, j))])))
        writer.close()
        return root / "run"
    keys = names(VERL_NAMES, tags)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "TRACKIO_DIR": str(root),
           "WANDB_DISABLE_GIT": "true", "WANDB_CONSOLE": "off"}
    subprocess.run([sys.executable, "-c", WRITER, kind, str(root), str(steps), json.dumps(keys)], env=env,
                   check=True, cwd=root, capture_output=True)
    if kind == "wandb":
        return next((root / "wandb").glob("offline-run-*"))
    return root / "bench.db"


def replicate(kind: str, one: Path, root: Path, runs: int) -> list[Path]:
    out = []
    for i in range(runs):
        name = one.name
        if kind == "wandb":  # W&B folders of one run id are one (resumed) run: give each copy its own id
            name = f"{name.rsplit('-', 1)[0]}-bench{i:04d}"
        dst = root / f"r{i:02d}" / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if one.is_dir():
            shutil.copytree(one, dst)
        else:
            shutil.copy2(one, dst)
        out.append(dst)
    return out


# --------------------------------------------------------------------------- the bare parses
def bare_verl(paths):
    n = 0
    for p in paths:
        with open(p, "rb") as fh:
            for line in fh:
                n += len(json.loads(line)["data"])
    return n


def bare_trl(paths):
    n = 0
    for p in paths:
        for f in p.glob("checkpoint-*/trainer_state.json"):
            n += len(json.loads(f.read_bytes())["log_history"])
    return n


def bare_trackio(paths):
    n = 0
    for p in paths:
        con = sqlite3.connect(f"file:{p}?immutable=1", uri=True)
        for (blob,) in con.execute("SELECT metrics FROM metrics ORDER BY id"):
            n += len(json.loads(blob))
        con.close()
    return n


def _wandb_records(data: bytes):
    pos, end, parts = 7, len(data), []
    while pos + 7 <= end:
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack_from("<IHB", data, pos)
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            parts = [chunk]
        else:
            parts.append(chunk)
            if kind == 4:
                yield b"".join(parts)


def bare_wandb(paths, read_fields=True):
    """Frame and parse every record; with ``read_fields``, read each history item's name and value
    text, as json.loads hands over every value (protobuf decodes a field when it is read)."""
    from wandb.proto.wandb_internal_pb2 import Record

    parse, n = Record.FromString, 0
    for p in paths:
        for raw in _wandb_records(next(p.glob("*.wandb")).read_bytes()):
            rec = parse(raw)
            if read_fields and rec.WhichOneof("record_type") == "history":
                for it in rec.history.item:
                    _ = (it.key or it.nested_key[0], it.value_json)
                    n += 1
            n += not read_fields
    return n


def bare_tensorboard(paths, read_fields=True):
    """Frame and parse every record; with ``read_fields``, read each scalar's step, tag and value."""
    from tensorboard.compat.proto.event_pb2 import Event

    parse, n = Event.FromString, 0
    for p in paths:
        for f in sorted(p.glob("events.out.tfevents.*")):
            data = f.read_bytes()
            pos, end = 0, len(data)
            while pos + 12 <= end:
                (length,) = struct.unpack_from("<Q", data, pos)
                ev = parse(data[pos + 12:pos + 12 + length])
                pos += 16 + length
                if read_fields:
                    for v in ev.summary.value:
                        _ = (ev.step, v.tag, v.simple_value)
                n += 1
    return n


BARE = {"verl": bare_verl, "trl": bare_trl, "trackio": bare_trackio, "wandb": bare_wandb,
        "tensorboard": bare_tensorboard}


def tbparse_peer(paths):
    from tbparse import SummaryReader

    return sum(len(SummaryReader(str(p)).scalars) for p in paths)


def event_accumulator_peer(paths):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    n = 0
    for p in paths:
        ea = EventAccumulator(str(p), size_guidance={"scalars": 0, "tensors": 0})
        ea.Reload()
        n += sum(len(ea.Scalars(t)) for t in ea.Tags()["scalars"])
    return n


# --------------------------------------------------------------------------- timing
def importer_only(kind, paths):
    from armorlab.analysis import importers

    runs = importers.read(importers.plan(paths, format=kind))
    return sum(r.table.num_rows * (r.table.num_columns - 1) for r in runs)


def via_load(kind, paths):
    from armorlab.analysis.load import load

    rs = load(paths, format=kind, cache=False)
    return len(rs.wide)


def best(fn, *args, repeats):  # noqa: D103
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--tags", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peer-runs", type=int, default=2, help="runs tbparse and EventAccumulator read")
    ap.add_argument("--formats", default="verl,trl,trackio,wandb,tensorboard")
    ap.add_argument("--dir", help="keep the files here (reused when present)")
    args = ap.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="import-bench-"))
    results = {"runs": args.runs, "steps": args.steps, "tags": args.tags, "repeats": args.repeats,
               "load_before": os.getloadavg()[0]}
    try:
        for kind in args.formats.split(","):
            root = base / kind
            marker = root / f".done-{args.runs}-{args.steps}-{args.tags}"
            if not marker.exists():
                t = time.perf_counter()
                one_marker = root / f".one-{args.steps}-{args.tags}"
                if one_marker.exists():  # the library-written run of this size: only copied again
                    one = Path(one_marker.read_text())
                else:
                    shutil.rmtree(root, ignore_errors=True)
                    one = write_one(kind, root / "one", args.steps, args.tags)
                    one_marker.write_text(str(one))
                shutil.rmtree(root / "runs", ignore_errors=True)
                for stale in root.glob(".done-*"):  # the copies of another run count are gone
                    stale.unlink()
                paths = replicate(kind, one, root / "runs", args.runs)
                marker.write_text(json.dumps([str(p) for p in paths]))
                print(f"{kind}: wrote {args.runs} runs in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            paths = [Path(p) for p in json.loads(marker.read_text())]
            n_bare = BARE[kind](paths)  # warm the page cache and the imports
            n_imp = importer_only(kind, paths)
            bare_t = imp_t = load_t = float("inf")
            for _ in range(args.repeats):  # alternated: a busy spell hits both
                bare_t = min(bare_t, best(BARE[kind], paths, repeats=1))
                imp_t = min(imp_t, best(importer_only, kind, paths, repeats=1))
                load_t = min(load_t, best(via_load, kind, paths, repeats=1))
            entry = {"bare_s": round(bare_t, 3), "importer_s": round(imp_t, 3), "load_s": round(load_t, 3),
                     "importer_vs_bare": round(imp_t / bare_t, 3), "load_vs_bare": round(load_t / bare_t, 3),
                     "records_bare": n_bare, "values_imported": n_imp}
            if kind in ("wandb", "tensorboard"):  # the protobuf parse without reading any field
                parse_t = min(best(BARE[kind], paths, False, repeats=1) for _ in range(args.repeats))
                entry.update(parse_only_s=round(parse_t, 3), importer_vs_parse_only=round(imp_t / parse_t, 3),
                             load_vs_parse_only=round(load_t / parse_t, 3))
            if kind == "tensorboard":
                sub = paths[: args.peer_runs]
                imp_sub = best(importer_only, kind, sub, repeats=args.repeats)
                load_sub = best(via_load, kind, sub, repeats=args.repeats)
                for name, peer in (("tbparse", tbparse_peer), ("event_accumulator_all_points", event_accumulator_peer)):
                    try:
                        peer_t = best(peer, sub, repeats=1)
                    except ImportError as exc:
                        entry[f"vs_{name}"] = f"not installed: {exc}"
                        continue
                    entry[f"{name}_s_on_{len(sub)}_runs"] = round(peer_t, 3)
                    entry[f"importer_vs_{name}"] = round(imp_sub / peer_t, 4)
                    entry[f"load_vs_{name}"] = round(load_sub / peer_t, 4)
            results[kind] = entry
            print(json.dumps({kind: entry}), file=sys.stderr)
    finally:
        results["load_after"] = os.getloadavg()[0]
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
