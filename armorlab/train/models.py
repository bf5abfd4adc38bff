"""Tiny offline causal LMs for tests and the demo: built in code, warm-started, cached on disk.

``prepare_model(config["model"], config["task"])`` returns a directory loadable with
``AutoModelForCausalLM/AutoTokenizer.from_pretrained`` (contract C2). For ``name: tiny`` it
builds, once per settings, a small Llama-architecture LM (untied embeddings, head_dim ≥ 32, so
vLLM's CPU backend can run it too) with a char-level tokenizer over printable ASCII, and
warm-starts it supervised on the task until it is partly right (default: 60 % greedy accuracy
on a dev slice of the train pool), so RL has room to improve. Any other name is a model path
or hub id and is returned unchanged (nothing is downloaded here).

Cache: ``$ARMORLAB_CACHE`` or ``~/.cache/armorlab``, under ``models/tiny-<hash>/`` where the hash
covers the model settings, the task settings the warm start reads and ``MODEL_VERSION``. A build
happens in a temporary directory renamed into place, under a file lock, so sweep jobs starting
together build it once and never see half a model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from armorlab.core.config import TINY_MAX_POSITIONS, TINY_MODEL, resolve
from armorlab.core.fsutil import cache_root
from armorlab.errors import ArmorLabError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

    from armorlab.tasks import Task

log = logging.getLogger(__name__)

# Bump when the architecture, tokenizer or warm-start recipe changes: old cache entries then
# stop matching instead of being reused with a different meaning.
MODEL_VERSION = 5
METADATA = "armorlab_model.json"
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARS = tuple(chr(i) for i in range(32, 127)) + ("\n", "\t")  # printable ASCII + newline, tab
MAX_POSITIONS = TINY_MAX_POSITIONS

# Warm-start recipe (the step count is model.warm_start_steps; the rest is fixed here).
WS_BATCH = 64
WS_LR = 1e-3
WS_WARMUP = 100
WS_DEV = 128  # pool prompts set aside to decide when the warm start has gone far enough (at most)
WS_DEV_SHARE = 4  # … and at most a quarter of a small pool (a user's own file), at least WS_DEV_MIN
WS_DEV_MIN = 8
WS_MAX_PASSES = 20  # passes over the pool: more memorise a small pool (the built-in pools never bind)
WS_CHECK_EVERY = 25
WS_EVAL_SAMPLES = 4  # completions per val prompt when the build reports its val accuracy

# Number of tiny models this process built (tests check that a cached one is not rebuilt).
builds = 0


# --------------------------------------------------------------------------- locations
def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    try:
        with open(Path(path).expanduser(), "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return "unreadable"  # build_task reports the real error with key and file
    return h.hexdigest()


def warm_start_settings(task_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The task settings a tiny model's warm start depends on (part of its cache key).

    Arithmetic warms up on the pool from ``warm_start_offset`` on, so neither ``train_size`` nor
    (within the reserve) ``val_size``/``test_size`` is part of the key: those runs share one base
    model. Math warms up on its train split, keyed by the file's content rather than its path.
    """
    cfg = dict(task_cfg)
    if cfg["name"] in ("arithmetic", "scratchpad"):
        from armorlab.tasks.arithmetic import warm_start_offset

        cfg["warm_start_offset"] = warm_start_offset(cfg)
        for key in ("train_size", "val_size", "test_size"):
            cfg.pop(key)
    elif cfg["name"] == "math":
        cfg["path"] = _file_digest(cfg["path"])
    return cfg


def model_key(model_cfg: Mapping[str, Any], task_cfg: Mapping[str, Any]) -> str:
    payload = {"version": MODEL_VERSION, "model": dict(model_cfg), "task": warm_start_settings(task_cfg)}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- tokenizer + model
def build_tokenizer() -> PreTrainedTokenizerFast:
    """Char-level tokenizer: one token per printable ASCII char, ``<s>`` prepended, Fuse decoder.

    A BPE model with no merges splits text into single characters and maps anything outside the
    vocabulary to ``<unk>``. Padding is on the left, where generation needs it.
    """
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.add_special_tokens(list(SPECIAL_TOKENS))
    core.decoder = decoders.Fuse()  # chars concatenate back without spaces
    bos_id = vocab[BOS]
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   unk_token=UNK, padding_side="left", model_max_length=MAX_POSITIONS)


def build_model(model_cfg: Mapping[str, Any], tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A randomly initialised Llama-architecture causal LM sized by ``model_cfg`` (seeded).

    Llama rather than Qwen2: transformers 5's AutoTokenizer replaces the tokenizer of any
    ``model_type: qwen2`` checkpoint with Qwen2Tokenizer's byte-level pipeline (it lists qwen2
    among models with an "incorrect hub tokenizer class"), which drops our char tokenizer's
    whitespace; Llama checkpoints load the saved tokenizer.json as is. The block is the same
    (RMSNorm, RoPE, SwiGLU; Qwen2 only adds q/k/v biases) and vLLM runs both.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, heads = model_cfg["hidden_size"], model_cfg["num_heads"]
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
        num_hidden_layers=model_cfg["num_layers"], num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=False, use_cache=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(model_cfg["warm_start_seed"])
    model = LlamaForCausalLM(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# --------------------------------------------------------------------------- warm start
def _examples(task: Task, tokenizer: PreTrainedTokenizerFast, prompts: list[str],
              answers: list[str], targets: list[str] | None = None) -> tuple[Any, Any]:
    """Teacher-forcing tensors: ids (right-padded) and labels.

    ``targets``: the completion text of each row (default: ``task.target_completion(answer)``).
    Labels are −100 on the prompt (incl. ``<s>``) and padding, so the loss covers the answer and
    its eos only.
    """
    import torch

    prompt_ids = tokenizer(prompts)["input_ids"]
    texts = targets if targets is not None else [task.target_completion(a) for a in answers]
    targets = tokenizer(texts, add_special_tokens=False)["input_ids"]
    seqs = [(p + t + [tokenizer.eos_token_id])[:MAX_POSITIONS] for p, t in zip(prompt_ids, targets, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, (p, s) in enumerate(zip(prompt_ids, seqs, strict=True)):
        ids[i, :len(s)] = torch.tensor(s)
        labels[i, len(p):len(s)] = torch.tensor(s[len(p):])
    return ids, labels


def accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, prompts: list[str],
             answers: list[str], *, samples: int = 1, temperature: float = 0.0, seed: int = 0,
             max_new_tokens: int | None = None) -> float:
    """Mean task reward of ``samples`` completions per prompt; temperature 0 = one greedy completion."""
    import torch

    if max_new_tokens is None:
        max_new_tokens = (task.completion_chars or 64) + 1
    greedy = temperature == 0
    n = 1 if greedy else samples
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(**enc, do_sample=not greedy, temperature=None if greedy else temperature,
                             top_k=None, top_p=None, max_new_tokens=max_new_tokens, num_return_sequences=n,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model.train(was_training)
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    scores = task.score(texts, [a for a in answers for _ in range(n)])
    return sum(scores) / len(scores)


def warm_start(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, *, max_steps: int,
               seed: int, target: float | None) -> dict[str, Any]:
    """Supervised warm start on the task's warm-start pool, stopped once it is partly right.

    The accuracy of a small model on arithmetic jumps late and at a seed-dependent step (it
    must learn the carry before the first answer digit is right), so a fixed step count lands
    anywhere between 5 % and 85 %. Instead, every ``WS_CHECK_EVERY`` steps the greedy accuracy
    on a dev slice set aside from the pool (never val/test, never trained on) is measured and
    training stops when it reaches ``target``; ``max_steps`` caps it. Returns steps, last loss
    and dev accuracy.
    """
    import torch

    prompts, answers = list(task.warm_start["prompt"]), list(task.warm_start["answer"])
    # a task may give each row its own completion (scratchpad: a mix of derivation styles)
    targets = list(task.warm_start["target"]) if "target" in task.warm_start.column_names else None
    dev_n = min(WS_DEV, len(prompts) // WS_DEV_SHARE) if target is not None else 0
    dev_n = dev_n if dev_n >= WS_DEV_MIN else 0
    dev = (prompts[len(prompts) - dev_n:], answers[len(answers) - dev_n:])
    if dev_n:
        prompts, answers = prompts[:-dev_n], answers[:-dev_n]
        targets = targets[:-dev_n] if targets is not None else None
    result: dict[str, Any] = {"steps": 0, "loss": None, "dev_acc": None, "dev_prompts": dev_n}
    max_steps = min(max_steps, math.ceil(WS_MAX_PASSES * len(prompts) / WS_BATCH))
    if max_steps == 0:
        return result
    log.info("warm-starting the tiny model (once; then cached): up to %d steps of %d rows on %d pool rows, "
             "stopping at greedy accuracy %s on %s (model.warm_start_steps, model.warm_start_target)",
             max_steps, WS_BATCH, len(prompts), "—" if target is None or not dev_n else f"{target:g}",
             f"{dev_n} rows set aside" if dev_n else "no dev slice (fewer than "
             f"{WS_DEV_SHARE * WS_DEV_MIN} rows, or no target): all steps run")
    started = time.perf_counter()
    ids, labels = _examples(task, tokenizer, prompts, answers, targets)
    attention = (ids != tokenizer.pad_token_id).long()
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=WS_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WS_WARMUP))
    model.train()
    bar = _progress(max_steps)
    for step in range(1, max_steps + 1):
        bar.update(1)
        rows = torch.randint(0, ids.shape[0], (WS_BATCH,), generator=gen)
        out = model(input_ids=ids[rows], attention_mask=attention[rows], labels=labels[rows])
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        result.update(steps=step, loss=float(out.loss.detach()))
        if step % WS_CHECK_EVERY == 0 or step == max_steps:
            if dev_n:
                result["dev_acc"] = accuracy(model, tokenizer, task, *dev)
                bar.set_postfix(dev_acc=f"{result['dev_acc']:.2f}", target=target)
            per_step = (time.perf_counter() - started) / step
            # a log line too: a job's log file never sees the progress bar
            log.info("warm start step %d/%d: loss %.4f%s, %.2f s/step, at most %.0f s to go", step, max_steps,
                     result["loss"], "" if not dev_n else f", dev greedy accuracy {result['dev_acc']:.3f}",
                     per_step, per_step * (max_steps - step))
            if dev_n and result["dev_acc"] >= target:
                break
    bar.close()
    model.eval()
    return result


def _progress(total: int) -> Any:
    """The warm start's progress bar on stderr (a terminal only: job logs get the INFO line): it
    runs once per tiny model and task settings, for up to minutes on a CPU."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="warm-starting the tiny model (once; cached)", unit="step", leave=False,
                disable=None, mininterval=1.0)


# --------------------------------------------------------------------------- prepare (cached)
def _build(model_cfg: Mapping[str, Any], task_cfg: Mapping[str, Any], target: Path, final: Path) -> None:
    """Build, warm-start and save the tiny model into ``target``, which will be renamed to ``final``."""
    import torch

    from armorlab.tasks import build_task

    global builds
    started = time.perf_counter()
    task = build_task(task_cfg)
    tokenizer = build_tokenizer()
    threads = torch.get_num_threads()
    # One thread: the build then does not depend on the core count (reduction order) and does
    # not fight other jobs for cores; the model is too small for a second thread to pay off.
    torch.set_num_threads(1)
    # fork_rng: building must not shift the caller's RNG, or a run that finds the model cached
    # and one that builds it would sample differently.
    try:
        with torch.random.fork_rng(devices=[]):
            model = build_model(model_cfg, tokenizer)
            ws = warm_start(model, tokenizer, task, max_steps=model_cfg["warm_start_steps"],
                            seed=model_cfg["warm_start_seed"], target=model_cfg["warm_start_target"])
            val = (list(task.val["prompt"]), list(task.val["answer"]))
            val_t1 = accuracy(model, tokenizer, task, *val, samples=WS_EVAL_SAMPLES, temperature=1.0,
                              seed=model_cfg["warm_start_seed"])
            val_greedy = accuracy(model, tokenizer, task, *val)
    finally:
        torch.set_num_threads(threads)
    # TRL reloads the reference model from config._name_or_path when beta != 0.
    model.config._name_or_path = str(final)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    builds += 1
    meta = {
        # task = the settings of the run that built it; the cache key uses warm_start_settings(task)
        "version": MODEL_VERSION, "model": dict(model_cfg), "task": dict(task_cfg),
        "parameters": sum(p.numel() for p in model.parameters()),
        "warm_start": ws, "val_acc_t1": val_t1, "val_acc_greedy": val_greedy,
        "val_samples": WS_EVAL_SAMPLES, "build_seconds": round(time.perf_counter() - started, 2),
    }
    (target / METADATA).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    log.info("built tiny model: %d params, warm start %d steps, val acc %.3f (T=1) / %.3f (greedy), %.1fs",
             meta["parameters"], ws["steps"], val_t1, val_greedy, meta["build_seconds"])


def check_loadable(name: str | os.PathLike) -> None:
    """The model's config as transformers reads it, and its architecture built on the meta device
    (no memory, no weights read): a config.json transformers refuses (an unknown model_type, heads
    that do not divide the hidden size, a value of the wrong type) is an ArmorLabError naming it,
    before any weights load. The files themselves were checked by config.resolve
    (armorlab.core.model_dir)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    where = Path(name) / "config.json" if Path(name).is_dir() else None
    try:
        config = AutoConfig.from_pretrained(str(name))
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001 - transformers raises ValueError, KeyError, TypeError, OSError...
        text = str(exc).strip().splitlines()
        raise ArmorLabError(f"transformers cannot build this model from its config.json: {type(exc).__name__}: "
                            f"{text[0][:300] if text else ''}", key="model", value=str(name),
                            file=str(where) if where else None) from None


def cached_model(model_cfg: Mapping[str, Any], task_cfg: Mapping[str, Any], *,
                 cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The directory to load the policy from when nothing needs building: a model path or hub id,
    or the tiny model already in the cache; None when the tiny model would be built (warm-started)
    first. For commands that must not train (``check-task``)."""
    resolved = resolve({"model": dict(model_cfg), "task": dict(task_cfg)})
    model_cfg, task_cfg = resolved["model"], resolved["task"]
    if model_cfg["name"] != TINY_MODEL:
        check_loadable(model_cfg["name"])
        return Path(model_cfg["name"])
    final = cache_root(cache_dir) / "models" / f"tiny-{model_key(model_cfg, task_cfg)}"
    return final.resolve() if (final / METADATA).is_file() else None


def has_chat_template(model: str | os.PathLike) -> bool:
    """Whether the tokenizer saved with a model (a directory or a cached hub id) has a chat
    template: in ``chat_template.jinja``/``.json`` or in ``tokenizer_config.json``. No tokenizer is loaded."""
    path = Path(model)
    if not path.is_dir():
        from armorlab.core.identity import hub_snapshot

        snapshot = hub_snapshot(str(model), "model")
        if snapshot is None:
            return False
        path = snapshot
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def prepare_model(model_cfg: Mapping[str, Any], task_cfg: Mapping[str, Any], *,
                  cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory (or hub id) to load the policy from; builds and caches the tiny model on first use.

    ``model_cfg``/``task_cfg`` are the resolved ``model``/``task`` sections (partial ones are
    resolved here). Safe to call from several processes at once.
    """
    from filelock import FileLock, Timeout

    model_cfg = dict(model_cfg) if isinstance(model_cfg, Mapping) else model_cfg
    task_cfg = dict(task_cfg) if isinstance(task_cfg, Mapping) else task_cfg
    resolved = resolve({"model": model_cfg, "task": task_cfg})
    model_cfg, task_cfg = resolved["model"], resolved["task"]
    if model_cfg["name"] != TINY_MODEL:
        check_loadable(model_cfg["name"])
        return Path(model_cfg["name"])  # resolve() made it an absolute directory or a cached hub id
    key = model_key(model_cfg, task_cfg)
    models_dir = cache_root(cache_dir) / "models"
    final = models_dir / f"tiny-{key}"
    if (final / METADATA).is_file():
        return _said_short(final.resolve(), model_cfg)
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArmorLabError(f"cannot create the tiny-model cache: {exc.strerror or exc}",
                            key="ARMORLAB_CACHE" if cache_dir is None else "cache_dir",
                            value=str(models_dir.parent)) from None
    lock = FileLock(str(models_dir / f"tiny-{key}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("waiting for another process building tiny model %s", key)
        lock.acquire()
    try:
        if (final / METADATA).is_file():  # another process built it while we waited
            return _said_short(final.resolve(), model_cfg)
        # Holding the lock we are the only builder: temp dirs of this key are left by killed
        # builds, and a final dir without metadata is not a finished build (e.g. a partial copy).
        for stale in models_dir.glob(f".tiny-{key}.*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".tiny-{key}.", dir=models_dir))
        try:
            log.info("building tiny model %s in %s", key, models_dir)
            _build(model_cfg, task_cfg, tmp, final.resolve())
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        lock.release()
    return _said_short(final.resolve(), model_cfg)


def _said_short(final: Path, model_cfg: Mapping[str, Any]) -> Path:
    """``final``, after a warning where its warm start fell short of ``warm_start_target`` (or could
    not check it): RL from a model that solves nothing sees reward 0 in every group, so no gradient."""
    target = model_cfg.get("warm_start_target")
    ws = json.loads((final / METADATA).read_text(encoding="utf-8")).get("warm_start") or {}
    if target is None or not ws.get("steps"):
        return final
    if not ws.get("dev_prompts"):
        log.warning("the tiny model's warm start could not check its target %g: the pool is too small for a "
                    "dev slice (%d rows at least); the tiny model learns the built-in tasks, for your own data "
                    "use a real model (model: a path or hub id)", target, WS_DEV_SHARE * WS_DEV_MIN)
    elif ws["dev_acc"] < target:
        log.warning("the tiny model's warm start reached greedy accuracy %.3f on %d dev rows after %d steps, "
                    "below its target %g: expect rewards near 0 and steps without gradient. The tiny model "
                    "learns the built-in tasks; for your own data use a real model (model: a path or hub id), "
                    "or raise model.warm_start_steps", ws["dev_acc"], ws["dev_prompts"], ws["steps"], target)
    return final
