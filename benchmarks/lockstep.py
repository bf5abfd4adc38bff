"""Several trainers trained in lockstep: one optimizer step each, in turn, so they share the machine's spells.

A shared machine's speed drifts by a third over seconds (consecutive 0.13 s slices of the same
work correlate 0.83 at lag 1 and about 0.1 at 4 s), so trainers timed one after another compare
different spells. Here each trainer's ``train()`` runs in its own thread, and the main thread
hands a single turn round: a trainer runs from one ``on_step_begin`` to its next, then waits.
Only one thread computes at any time, each step of every trainer falls within a fraction of a
second of the same step of the others, and the clock (``time.thread_time`` by default) is read in
the trainer's own thread, so waiting costs nothing.

Global RNG state (torch, numpy, random) is saved when a trainer gives up its turn and restored
when it gets it back, so each draws exactly the numbers it would draw alone.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import numpy as np
import torch
from transformers import TrainerCallback


def rng_state() -> tuple:
    """The global RNG states a trainer draws from: torch (CPU), numpy and random."""
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    np.random.set_state(state[1])
    random.setstate(state[2])


class _Turn(TrainerCallback):
    """One trainer's side: times each step from its ``on_step_begin`` to the next, then yields."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)
        self.steps: list[float] = []
        self.rng: tuple | None = None
        self.finished = False
        self.error: BaseException | None = None
        self._start = 0.0
        self._stepping = False  # from the first on_step_begin: before it, the trainer's set-up

    def wait_for_turn(self) -> None:
        self.go.acquire()
        _set_rng_state(self.rng)
        self._start = self.clock()

    def give_up_turn(self) -> None:
        self.rng = rng_state()
        self.done.release()

    def on_step_begin(self, args, state, control, **kwargs):
        if self._stepping:
            self.steps.append(self.clock() - self._start)  # the previous step, its logging included
        self._stepping = True
        self.give_up_turn()
        self.wait_for_turn()


def run_lockstep(trainers: dict[str, object], clock: Callable[[], float] = time.thread_time,
                 rng: dict[str, tuple] | None = None) -> dict[str, list[float]]:
    """Train every trainer to its end, a step each in turn; each one's step times, in order.

    A step's time runs from its ``on_step_begin`` to the next one, so its logging and callbacks
    count; the last step (which ends in the end of training) is not timed. The order of turns
    rotates by one every round, so no trainer always follows the same one. ``rng`` gives a
    trainer's global RNG state to start from (default: the state when this is called), e.g. the
    state right after the trainer was built, as when it is built and trained alone. A trainer's
    exception is raised here once the others have finished.
    """
    start_state = rng_state()
    turns = {name: _Turn(clock) for name in trainers}
    threads = []
    for name, trainer in trainers.items():
        turn = turns[name]
        turn.rng = (rng or {}).get(name, start_state)
        trainer.add_callback(turn)

        def train(trainer=trainer, turn=turn) -> None:
            try:
                turn.wait_for_turn()
                trainer.train()
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                turn.error = exc
            finally:
                turn.finished = True
                turn.done.release()

        threads.append(threading.Thread(target=train, name=f"lockstep-{name}", daemon=True))
    for thread in threads:
        thread.start()
    alive, rounds = list(trainers), 0
    while alive:
        shift = rounds % len(alive)
        for name in alive[shift:] + alive[:shift]:
            turns[name].go.release()
            turns[name].done.acquire()
        alive = [name for name in alive if not turns[name].finished]
        rounds += 1
    for thread in threads:
        thread.join()
    for name, turn in turns.items():
        if turn.error is not None:
            raise RuntimeError(f"trainer {name!r} failed in lockstep") from turn.error
    _set_rng_state(start_state)
    return {name: turn.steps for name, turn in turns.items()}


def cycles(steps: list[float], per_cycle: int, warmup: int = 1) -> list[float]:
    """Whole generation cycles (``per_cycle`` consecutive steps from the first), the first
    ``warmup`` cycles dropped: each cycle's summed step time."""
    whole = len(steps) // per_cycle
    return [sum(steps[c * per_cycle:(c + 1) * per_cycle]) for c in range(warmup, whole)]


class Split:
    """Where a trainer's generation cycles go: the clock spent inside named methods, per cycle.

    ``parts`` maps a part to (object, method name); each method is wrapped on its instance and
    its time (on ``clock``, in the calling thread) is added to the cycle the trainer is in
    (``state.global_step // per_cycle``). Nested parts are not subtracted here: :meth:`per_cycle`
    says what to subtract from what.
    """

    def __init__(self, trainer, parts: dict[str, tuple[object, str]], per_cycle: int,
                 clock: Callable[[], float] = time.thread_time) -> None:
        self.trainer, self.per_cycle, self.clock = trainer, per_cycle, clock
        self.spent: dict[str, dict[int, float]] = {name: {} for name in parts}
        for name, (owner, method) in parts.items():
            setattr(owner, method, self._timed(name, getattr(owner, method)))

    def _timed(self, name: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                cycle = self.trainer.state.global_step // self.per_cycle
                self.spent[name][cycle] = self.spent[name].get(cycle, 0.0) + self.clock() - start
        return timed

    def mean(self, name: str, cycles: range) -> float:
        """Mean over ``cycles`` of the time spent in part ``name``."""
        return sum(self.spent[name].get(c, 0.0) for c in cycles) / max(len(cycles), 1)
