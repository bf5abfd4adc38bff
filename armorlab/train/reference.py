"""The reference policy π_ref: a frozen copy of the policy, reset π_ref ← π_θ on a schedule.

ARMOR draws its anchors from π_ref and mixes π_ref into the importance ratio; every τ steps the
reference is reset to the current policy so anchors never lag the policy by more than τ steps.
The same reference serves TRL's β·KL term, the KL telemetry and the exact-KL probe.

The schedule functions are pure (no torch); :class:`ReferencePolicy` holds the model and the
reset counter and saves both into a checkpoint so a resumed run continues with the same π_ref.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STATE_FILE = "reference_state.json"
WEIGHTS_FILE = "reference.safetensors"


# --------------------------------------------------------------------------- schedule (pure)
def reset_interval(step: int, ref_reset_steps: int, schedule: Sequence[Sequence[int | None]] | None) -> int:
    """τ in force at optimizer step ``step`` (1-based).

    ``schedule`` is ``[[until_step, τ], ...]`` with increasing ``until_step`` (armorlab.core.config
    validates it): the first pair with ``step ≤ until_step`` gives τ — the boundary step belongs
    to the pair that names it — and a null ``until_step`` (last pair only) covers every later
    step; past the last pair, ``ref_reset_steps`` does. τ = 0 means a static reference. So
    ``[[180, 1], [None, 0]]`` resets at steps 1, 2, ..., 180 and never after.
    """
    for until, tau in schedule or ():
        if until is None or step <= until:
            return int(tau)
    return int(ref_reset_steps)


def reset_due(step: int, ref_reset_steps: int, schedule: Sequence[Sequence[int]] | None) -> bool:
    """True when π_ref ← π_θ happens at the end of optimizer step ``step``: ``step % τ == 0``, τ > 0.

    Counting is global (not from the start of a schedule segment), so ``[[100, 10]]`` resets at
    steps 10, 20, ..., 100.
    """
    tau = reset_interval(step, ref_reset_steps, schedule)
    return step > 0 and tau > 0 and step % tau == 0


# --------------------------------------------------------------------------- who reads π_ref
def reference_needed(args: Any, validating: bool) -> bool:
    """Whether anything in a run reads π_ref (else it is not built: no memory, no forwards).

    Readers: an objective that mixes π_ref in (armor), TRL's β·KL (β ≠ 0), anchors and the gate
    (they sample π_ref), the KL telemetry (``kl_telemetry``: kl/reverse_* on a share of the rows),
    and with a val split: the exact-KL probe (``kl_probe_prompts``) and π_ref's own validation at
    every reset (``ref_validate_resets``). The token dump alone does not build it.
    """
    from armorlab.algos.objectives import objective_spec

    validates = validating and args.val_every > 0
    resets = bool(args.ref_reset_steps or args.ref_reset_schedule)
    return bool(objective_spec(args.objective).uses_reference or args.beta != 0.0 or args.anchor
                or args.anchor_gate or args.kl_telemetry
                or (validates and (args.kl_probe_prompts > 0 or (resets and args.ref_validate_resets))))


def telemetry_generation(generation: int, share: float) -> bool:
    """Whether generation ``generation`` (0-based) is one of the ``share`` of generations the KL
    telemetry scores: every (1/share)-th, the first included; none at share 0."""
    return share > 0 and generation % max(1, round(1.0 / share)) == 0


def reference_scored(args: Any, *, beta: float, has_reference: bool, telemetry_now: bool) -> bool:
    """Whether a generation's rows get π_ref's log-probs.

    Always where something trains on them (armor's r_mix, β·KL, anchor rows' ratios). Else only
    for the ``kl/reverse_*`` telemetry on the generations it
    scores (``telemetry_now``: whole generations, so each logged value stands on a generation's
    sequences and a sharded π_ref runs one full forward in 8 generations, not a small one in
    each); the choice is the same on every process. Never without telemetry or π_ref. The token
    dump records π_ref where it is scored anyway (NaN elsewhere): a baseline never pays a π_ref
    forward for a dump.
    """
    from armorlab.algos.objectives import objective_spec

    if objective_spec(args.objective).uses_reference or beta != 0.0 or args.anchor:
        return True
    return has_reference and bool(args.kl_telemetry) and telemetry_now


# --------------------------------------------------------------------------- model holder
def build_reference_model(model: Any, args: Any) -> Any:
    """A frozen, eval-mode copy of the policy, made BEFORE ``GRPOTrainer.__init__``.

    TRL patches the policy's ``forward`` in ``__init__`` (a fused LM head bound to that very
    model), so a deepcopy taken afterwards would silently run the *policy* when generating.
    A path is loaded again the way TRL loads the policy (same ``model_init_kwargs``), and every
    load option TRL applies to the policy's weights is applied here too (``cast_lm_head_to_fp32``),
    so a reset copies into tensors of the policy's dtypes and π_ref scores exactly like π_θ.
    """
    from trl.trainer.utils import create_model_from_path, disable_dropout_in_model

    if isinstance(model, str):
        kwargs = dict(args.model_init_kwargs or {})
        if args.distributed_state.distributed_type in ("MULTI_GPU", "DEEPSPEED"):
            kwargs["device_map"] = None
        kwargs.setdefault("trust_remote_code", args.trust_remote_code)
        ref = create_model_from_path(model, **kwargs)
    else:
        ref = copy.deepcopy(model)
    if args.disable_dropout:
        disable_dropout_in_model(ref)
    if getattr(args, "cast_lm_head_to_fp32", False):
        cast_lm_head_to_fp32(ref)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def cast_lm_head_to_fp32(model: Any) -> None:
    """What ``GRPOTrainer.__init__`` does to the policy under ``cast_lm_head_to_fp32`` (its local
    ``_cast_lm_head_to_fp32``, not importable): the LM head's weights in float32, its projection
    in float32, and with tied embeddings the embedding output cast back to the model's dtype."""
    import torch
    from torch import nn

    original = model.lm_head.weight.dtype
    head = model.lm_head.float()
    model.lm_head = head

    def forward_fp32(hidden_states):
        return nn.functional.linear(hidden_states.to(torch.float32), head.weight.to(torch.float32),
                                    None if head.bias is None else head.bias.to(torch.float32))

    head.forward = forward_fp32
    if model.config.tie_word_embeddings:
        model.model.embed_tokens.register_forward_hook(lambda module, args, output: output.to(original))


class ReferencePolicy:
    """Holds π_ref and performs resets; ``resets`` counts them for the ``ref/resets`` metric."""

    def __init__(self, model: Any, *, ref_reset_steps: int = 0,
                 schedule: Sequence[Sequence[int | None]] | None = None) -> None:
        self.model = model
        self.ref_reset_steps = int(ref_reset_steps)
        self.schedule = [list(p) for p in schedule] if schedule else None
        self.resets = 0
        self.last_reset_step = 0

    def due(self, step: int) -> bool:
        return reset_due(step, self.ref_reset_steps, self.schedule)

    def reset_from(self, policy: Any, step: int) -> None:
        """π_ref ← π_θ: copy the weights in place, so every holder of ``self.model`` sees them.

        ``policy`` may be wrapped (DDP) or sharded (FSDP 2): :func:`copy_weights` copies each
        process's local shards where π_ref is sharded like the policy (TRL's ``prepare_fsdp`` and
        accelerate shard both over one mesh, each parameter on dim 0), so no process ever holds
        more than its shard; FSDP 1's flat parameters go through a full state dict. Every process
        must call it. A run whose π_ref nothing reads holds none (``model`` None): only the counter moves.
        """
        import torch

        if self.model is not None:
            with torch.no_grad():
                copy_weights(self.model, policy)
        self.resets += 1
        self.last_reset_step = int(step)
        log.info("reference reset to the policy at step %d (reset #%d)", step, self.resets)

    # ------------------------------------------------------------------ checkpoint
    def save(self, checkpoint_dir: str | Path, *, write: bool = True) -> None:
        """Counter always; weights (gathered whole) only once a reset made them differ from the
        initial model. Every process calls it; only those with ``write`` write."""
        from safetensors.torch import save_file

        from armorlab.core.fsutil import atomic_write_json

        checkpoint_dir = Path(checkpoint_dir)
        weights = full_state_dict(self.model, cpu=True) if self.resets and self.model is not None else None
        if not write:
            return
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        if weights is not None:
            tmp = checkpoint_dir / f".{WEIGHTS_FILE}.tmp"
            save_file(_untied(weights), str(tmp))
            tmp.replace(checkpoint_dir / WEIGHTS_FILE)
        atomic_write_json(checkpoint_dir / STATE_FILE,
                          {"resets": self.resets, "last_reset_step": self.last_reset_step})

    def load(self, checkpoint_dir: str | Path) -> None:
        from safetensors.torch import load_file

        checkpoint_dir = Path(checkpoint_dir)
        state_path = checkpoint_dir / STATE_FILE
        if not state_path.is_file():
            log.warning("no reference state in %s; keeping the initial reference", checkpoint_dir)
            return
        from armorlab.core.fsutil import read_regular_text

        state = json.loads(read_regular_text(state_path))
        self.resets = int(state["resets"])
        self.last_reset_step = int(state["last_reset_step"])
        if self.resets and self.model is not None:
            load_full_state_dict(self.model, load_file(str(checkpoint_dir / WEIGHTS_FILE)))


# --------------------------------------------------------------------------- weights
# wrappers that rename parameters without changing them: activation checkpointing, torch.compile
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def plain_name(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (what HF and vLLM call it)."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def named_tensors(model: Any) -> list[tuple[str, Any]]:
    """(plain name, tensor) of every parameter (tied ones once) and buffer, local shards as they are."""
    return [(plain_name(n), t) for n, t in (*model.named_parameters(), *model.named_buffers())]


def copy_weights(dst: Any, src: Any) -> None:
    """Copy ``src``'s parameters and buffers into ``dst``'s, one tensor at a time.

    A DTensor pair with one layout (FSDP 2's mesh and placements) copies its local shards: no
    communication, nothing gathered. Other pairs move one parameter at a time (redistributed,
    gathered with ``full_tensor`` or scattered), so the transient peak is one parameter, never
    the model. FSDP 1 (flat parameters) goes through a full state dict.
    """
    if _is_fsdp1(dst) or _is_fsdp1(src):
        load_full_state_dict(dst, full_state_dict(src))
        return
    source = dict(named_tensors(src))
    for name, target in named_tensors(dst):
        if name not in source:
            raise KeyError(f"π_ref has {name!r}, the policy does not: they are not the same architecture")
        copy_tensor(target, source[name])


def copy_tensor(target: Any, source: Any) -> None:
    """``target`` ← ``source`` for any mix of plain tensors and DTensors (dtype cast as ``copy_`` does)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    t_dt, s_dt = isinstance(target, DTensor), isinstance(source, DTensor)
    if t_dt and s_dt:
        if source.device_mesh == target.device_mesh:
            if tuple(source.placements) != tuple(target.placements):
                source = source.redistribute(target.device_mesh, target.placements)
            target.to_local().copy_(source.to_local())
        else:
            target.to_local().copy_(distribute_tensor(source.full_tensor(), target.device_mesh,
                                                      target.placements).to_local())
    elif s_dt:
        target.copy_(source.full_tensor())
    elif t_dt:
        target.to_local().copy_(distribute_tensor(source.to(target.device), target.device_mesh,
                                                  target.placements).to_local())
    else:
        target.copy_(source)


def full_parameters(model: Any, device: Any = None) -> Any:
    """(plain name, whole tensor) of each parameter, one at a time (tied ones once).

    A DTensor is gathered with ``full_tensor()`` — a collective, so every process of the mesh must
    iterate to the end — and the previous one is freed before the next is gathered: the peak is
    one parameter, never the model. This is what a weight push streams (``load_weights`` takes
    any iterable of pairs). ``device``: where a shard offloaded to the CPU is gathered (NCCL
    moves CUDA tensors only), as TRL does for its policy engine.
    """
    from torch.distributed.tensor import DTensor

    for name, param in model.named_parameters():
        tensor = param.detach()
        if isinstance(tensor, DTensor):
            if device is not None and tensor.device.type == "cpu" and getattr(device, "type", "cpu") != "cpu":
                tensor = tensor.to(device)
            tensor = tensor.full_tensor()
        yield plain_name(name), tensor


def _is_fsdp1(model: Any) -> bool:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(model, FullyShardedDataParallel) or any(
        isinstance(m, FullyShardedDataParallel) for m in model.modules())


# --------------------------------------------------------------------------- full weights
def full_state_dict(model: Any, *, cpu: bool = False) -> dict[str, Any]:
    """Every parameter and buffer whole, under its plain name, whatever wraps or shards ``model``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu))


def load_full_state_dict(model: Any, state: dict[str, Any], *, strict: bool = True) -> None:
    """Load full (unsharded) tensors into ``model``, each process keeping its own shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=strict))


def _untied(state: dict[str, Any]) -> dict[str, Any]:
    """safetensors refuses tensors that share memory (tied weights): store a copy of repeats."""
    seen: set[int] = set()
    out = {}
    for key, tensor in state.items():
        ptr = tensor.data_ptr()
        out[key] = tensor.clone() if ptr in seen else tensor.contiguous()
        seen.add(ptr)
    return out
