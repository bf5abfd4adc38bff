"""`armorlab check-task CFG`: look at what the model will see and how it is scored, before training.

For a few rows it prints the prompt exactly as the model receives it (after the tokenizer's chat
template, as TRL renders it), the reference answer, the reward of that answer written the way
the task expects it (``\\boxed{answer}`` for math: 1.0 unless math-verify cannot read the
answer), and one completion sampled from the model with the run's settings and its reward.
It never trains: with ``model: tiny`` the sample needs the warm-started tiny model, which the
first ``armorlab train`` of the config builds; until then the sample is skipped with a note.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def check_rows(cfg: dict[str, Any], *, rows: int, split: str, seed: int,
               summary: list[str] | None = None) -> list[dict[str, Any]]:
    """The printed facts per row: prompt text, answer, gold reward, sample, its reward, truncated.
    ``split``: train, val, test or a held-out set's name; ``summary`` gets one line per split (its
    rows, the repeated problems dropped from training, each held-out set's avg@n / pass@k)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.data_utils import maybe_apply_chat_template

    from armorlab.errors import ArmorLabError
    from armorlab.tasks import build_task
    from armorlab.tasks.mathfile import build_eval_sets
    from armorlab.train.models import cached_model, has_chat_template

    model_path = cached_model(cfg["model"], cfg["task"])  # never builds: check-task does not train
    task = build_task(cfg["task"], chat=has_chat_template(model_path) if model_path is not None else False)
    held_out = build_eval_sets(cfg, task)  # an overlap with training is an error here, as in training
    splits = {"train": task.train, "val": task.val, "test": task.test, **{n: s.data for n, s in held_out.items()}}
    if split not in splits:
        raise ArmorLabError(f"no such split (splits: {', '.join(splits)})", key="--split", value=split)
    data = splits[split]
    if summary is not None:
        dropped = task.settings.get("dedup_dropped")
        summary.append(f"train: {len(task.train)} rows" + ("" if dropped is None else
                       f" ({dropped} rows repeating an earlier problem dropped)") +
                       f"; val: {len(task.val)}; test: {len(task.test)}")
        summary += [f"{s.prefix}: {len(s.data)} problems" + (f" ({s.dropped} repeated rows dropped)" if s.dropped
                    else "") + f", avg@{s.samples}, pass@{s.k} ({s.path})" for s in held_out.values()]
    if model_path is None:  # the tiny model is not built: prompts and gold rewards only
        out = []
        for row in data.select(range(min(rows, len(data)))):
            gold = task.target_completion(row["answer"])
            out.append({"prompt": row["prompt"] if isinstance(row["prompt"], str) else str(row["prompt"]),
                        "answer": row["answer"], "gold_completion": gold,
                        "gold_reward": task.score([_as_completion(gold, row["prompt"])], [row["answer"]])[0],
                        "sample": None, "reward": None, "truncated": False})
        return out
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(str(model_path))
    model.eval()
    max_new = int(cfg.get("max_completion_length") or 256)
    torch.manual_seed(seed)
    out = []
    for row in data.select(range(min(rows, len(data)))):
        text = maybe_apply_chat_template({"prompt": row["prompt"]}, tokenizer)["prompt"]
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**ids, do_sample=True, temperature=float(cfg.get("temperature") or 1.0),
                                 max_new_tokens=max_new, pad_token_id=tokenizer.pad_token_id)
        new = gen[0, ids["input_ids"].shape[1]:].tolist()
        sample = tokenizer.decode(new, skip_special_tokens=True)
        eos = {tokenizer.eos_token_id, tokenizer.pad_token_id} | set(_as_list(model.generation_config.eos_token_id))
        gold = task.target_completion(row["answer"])
        out.append({"prompt": text, "answer": row["answer"], "gold_completion": gold,
                    "gold_reward": task.score([_as_completion(gold, row["prompt"])], [row["answer"]])[0],
                    "sample": sample, "reward": task.score([_as_completion(sample, row["prompt"])], [row["answer"]])[0],
                    "truncated": not new or new[-1] not in eos})
    return out


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _as_completion(text: str, prompt: Any) -> Any:
    return [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text


def register(app: typer.Typer) -> None:
    @app.command("check-task")
    def check_task(
        config: Path = typer.Argument(None, help="YAML run config; omit for the defaults."),
        set_: list[str] = typer.Option([], "--set", help="Override a key: --set task.path=data.jsonl"),
        rows: int = typer.Option(3, "--rows", min=1, help="How many rows to show."),
        split: str = typer.Option("val", "--split", help="train, val, test or a held-out set's name (eval_sets)."),
        seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    ) -> None:
        """Print a few prompts as the model sees them, a sample completion and the rewards."""
        from armorlab.core.config import load_config

        cfg = load_config(config, set_)
        unreadable = 0
        summary: list[str] = []
        facts = check_rows(cfg, rows=rows, split=split, seed=seed, summary=summary)
        for line in summary:
            typer.echo(line)
        for i, r in enumerate(facts, 1):
            typer.echo(f"─── row {i} ({split}) " + "─" * 40)
            typer.echo(f"prompt (as the model sees it):\n{r['prompt']}")
            typer.echo(f"answer: {r['answer']!r}   {r['gold_completion']!r} scores {r['gold_reward']:.1f}")
            if r["sample"] is not None:
                cut = " (cut at max_completion_length)" if r["truncated"] else ""
                typer.echo(f"sample{cut}:\n{r['sample']}\nreward: {r['reward']:.1f}")
            unreadable += r["gold_reward"] < 1.0
        if any(r["sample"] is None for r in facts):
            typer.echo("note: no sample: the tiny model is not built for this task yet, and check-task does not "
                       "train. The first `armorlab train` of this config warm-starts it on the task's train split "
                       "(once, cached): at most model.warm_start_steps steps and 20 passes over the rows, stopped at "
                       "model.warm_start_target greedy accuracy on a dev slice; its log says each step's cost. "
                       "The tiny model learns the built-in tasks; for your own data use a real model.",
                       err=True)
        if unreadable:
            typer.echo(f"warning: {unreadable} reference answer(s) do not score 1.0 even written as the task "
                       "expects: math-verify cannot read them", err=True)
