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


# --------------------------------------------------------------------------- model holder
def build_reference_model(model: Any, args: Any) -> Any:
    """A frozen, eval-mode copy of the policy, made BEFORE ``GRPOTrainer.__init__``.

    TRL patches the policy's ``forward`` in ``__init__`` (a fused LM head bound to that very
    model), so a deepcopy taken afterwards would silently run the *policy* when generating.
    A path is loaded again the way TRL loads the policy (same ``model_init_kwargs``).
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
    ref.eval()
    ref.requires_grad_(False)
    return ref


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
        """π_ref ← π_θ: copy the FULL weights in place, so every holder of ``self.model`` sees them.

        ``policy`` may be wrapped (DDP, FSDP) or sharded (FSDP 1 and 2): torch's
        ``get_model_state_dict(full_state_dict=True)`` gathers each parameter whole and
        ``set_model_state_dict`` scatters it into π_ref's own layout, so the copy never depends
        on both models being sharded alike. Every process must call it (the gather is a collective).
        """
        import torch

        with torch.no_grad():
            load_full_state_dict(self.model, full_state_dict(policy))
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
        weights = full_state_dict(self.model, cpu=True) if self.resets else None  # a collective: all ranks
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
        state = json.loads(state_path.read_text(encoding="utf-8"))
        self.resets = int(state["resets"])
        self.last_reset_step = int(state["last_reset_step"])
        if self.resets:
            load_full_state_dict(self.model, load_file(str(checkpoint_dir / WEIGHTS_FILE)))


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
