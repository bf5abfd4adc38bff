"""The report's figure worker: a child process that draws figures while the main process computes
the statistics (armorlab.analysis.report). It imports only the plotting code (numpy, matplotlib),
never pandas or scipy; requests and answers are length-prefixed pickles on its stdin/stdout.

A plain ``python -c`` child on pipes, not multiprocessing: spawn would re-run the caller's
``__main__`` script in the child (every ``python myscript.py`` without a main guard).

The worker imports matplotlib once and then forks a child per figure (where the OS has fork):
the figures are independent, so they draw on every core at once (on two cores, alongside the
main process's statistics) without a second interpreter's start-up and matplotlib import. The
worker itself only forwards requests and answers; a child that dies without answering is
answered for (WorkerDied), so that figure is drawn in the main process."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from armorlab.analysis import plots
from armorlab.core.runs import expand_globs, find_run_dirs

log = logging.getLogger(__name__)


class WorkerDied(RuntimeError):
    """The figure worker process ended before it answered."""


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack("<Q", len(data)) + data


def _send(stream, obj: Any) -> None:
    stream.write(_frame(obj))
    stream.flush()


def _recv(stream) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    data = stream.read(size)
    return pickle.loads(data) if len(data) == size else None


def _draw(msg: tuple) -> tuple:
    """Run one request (job, module, name, args, kwargs) → the answer (job, ok, path or error)."""
    import importlib
    import traceback

    job, module, name, args, kwargs = msg
    try:
        fn = getattr(importlib.import_module(module), name)
        return job, True, getattr(fn, "__wrapped__", fn)(*args, **kwargs)
    except Exception as exc:
        return job, False, RuntimeError(f"{name}: {exc!r}\n{traceback.format_exc()}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _take_frame(buf: bytearray) -> bytes | None:
    """Remove and return the first complete frame's payload from ``buf`` (None: not complete)."""
    if len(buf) < 8:
        return None
    (size,) = struct.unpack("<Q", buf[:8])
    if len(buf) < 8 + size:
        return None
    payload = bytes(buf[8:8 + size])
    del buf[:8 + size]
    return payload


def _fork_figure(msg: tuple, answers: int, children: dict[int, tuple[int, int, bytearray]]) -> int | None:
    """Draw one request in a forked child that answers through a pipe of its own; returns the
    pipe's read end (registered in ``children``), or None when it was drawn here (no fork, or
    no process or descriptor to spare) and already answered."""
    try:
        if not hasattr(os, "fork"):
            raise OSError("no fork on this platform")
        r, w = os.pipe()
    except OSError:
        _write_all(answers, _frame(_draw(msg)))
        return None
    try:
        pid = os.fork()
    except OSError:  # out of processes or memory
        os.close(r)
        os.close(w)
        _write_all(answers, _frame(_draw(msg)))
        return None
    if pid == 0:  # the child: draw, answer through its own pipe, exit at once (no teardown)
        code = 1
        try:
            for other in (0, answers, r, *children):
                os.close(other)
            _write_all(w, _frame(_draw(msg)))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    children[r] = (pid, msg[0], bytearray())
    return r


def serve_figures() -> None:
    """The worker's loop (``python -c "...serve_figures()"``): read (job, module, name, args,
    kwargs) from stdin, draw with the plain plot function in a forked child (in this process
    where there is no fork), answer (job, ok, path or error) on the stdout it was started with;
    anything else written to stdout goes to stderr. Exits when stdin ends and every child has
    answered."""
    import selectors

    answers = os.dup(1)
    os.dup2(2, 1)

    plots._matplotlib()  # matplotlib's import overlaps the main process's loading, and each child inherits it
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    inbox = bytearray()
    children: dict[int, tuple[int, int, bytearray]] = {}   # answer pipe → (pid, job, bytes so far)
    reading = True
    while reading or children:
        for key, _ in sel.select():
            fd = key.fd
            chunk = os.read(fd, 1 << 20)
            if fd == 0:
                if not chunk:
                    reading = False
                    sel.unregister(0)
                inbox += chunk
                while (payload := _take_frame(inbox)) is not None:
                    child = _fork_figure(pickle.loads(payload), answers, children)
                    if child is not None:
                        sel.register(child, selectors.EVENT_READ)
            elif chunk:
                children[fd][2].extend(chunk)
            else:  # the child is done: forward its answer, or say it died without one
                sel.unregister(fd)
                os.close(fd)
                pid, job, data = children.pop(fd)
                _, status = os.waitpid(pid, 0)
                if _take_frame(bytearray(data)) is None:
                    data = _frame((job, False, WorkerDied(f"figure process exited with status {status}")))
                _write_all(answers, bytes(data))
    # no interpreter teardown (matplotlib's, numpy's): every PNG is written and closed, and the
    # report waits for this exit (so that its CPU time is counted where it was spent)
    os._exit(0)


WORKER_MIN_BYTES = 8 << 20  # metrics.jsonl bytes from which the figures are drawn in a worker process


def wanted(paths: Sequence[str]) -> bool:
    """Whether a report of these inputs (run dirs, sweeps, globs) draws its figures in a worker:
    with more than one CPU and at least WORKER_MIN_BYTES of metrics.jsonl (below, the worker's
    start-up costs more than the figures it would draw alongside the statistics). Stdlib only:
    the report command asks before it imports pandas."""

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cpus < 2:
        return False
    total = 0
    try:
        for rd in find_run_dirs(expand_globs(paths)):
            with contextlib.suppress(OSError):
                total += rd.metrics_path.stat().st_size
    except Exception:  # inputs that cannot be listed: load says why
        return False
    return total >= WORKER_MIN_BYTES


class FigureWorker:
    """Draws the report's figures in one worker process while the main process computes the
    statistics (the figures cost about as much as the statistics, and share no state with
    them): started before the runs are loaded, so its interpreter and matplotlib import overlap
    the parsing. Without a worker (``enabled`` false, or one that cannot start or dies) each
    figure is drawn in-process, the same way."""

    def __init__(self, enabled: bool) -> None:
        self.proc: subprocess.Popen | None = None
        self.pending: dict[int, Future] = {}
        self.lock = threading.Lock()
        self.jobs = 0
        # requests are written by a thread: a pipe holds 64 KB, and while the worker imports
        # matplotlib or draws, a write of a figure's data from the main thread would wait for it
        self.outbox: queue.SimpleQueue[tuple[int, bytes] | None] = queue.SimpleQueue()
        if not enabled:
            return
        code = (f"import sys; sys.path[:0] = {[p for p in sys.path if p]!r}; "
                "from armorlab.analysis.figure_worker import serve_figures; serve_figures()")
        # one thread: the worker forks a process per figure, and a BLAS thread pool (numpy's
        # OpenBLAS starts one per core; a figure never needs it) would be forked half-alive
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env=env)
        except OSError as exc:
            log.info("figures drawn in-process (no worker: %s)", exc)
            return
        threading.Thread(target=self._answers, args=(self.proc,), daemon=True).start()
        threading.Thread(target=self._requests, args=(self.proc,), daemon=True).start()

    def _requests(self, proc: subprocess.Popen) -> None:
        while (item := self.outbox.get()) is not None:
            job, data = item
            try:
                proc.stdin.write(data)
                proc.stdin.flush()
            except OSError as exc:  # the worker is gone: this figure is drawn here
                with self.lock:
                    future = self.pending.pop(job, None)
                if future is not None:
                    future.set_exception(WorkerDied(f"figure worker unreachable: {exc}"))
        with contextlib.suppress(OSError):
            proc.stdin.close()  # end of requests: the worker's loop ends

    def _answers(self, proc: subprocess.Popen) -> None:
        while (msg := _recv(proc.stdout)) is not None:
            job, ok, value = msg
            with self.lock:
                future = self.pending.pop(job)
            future.set_result(value) if ok else future.set_exception(value)
        with self.lock:  # the worker is gone: whatever it did not answer is drawn here
            dead, self.pending = list(self.pending.values()), {}
        for future in dead:
            future.set_exception(WorkerDied(f"figure worker exited with {proc.wait()}"))

    def submit(self, fn: Callable[..., Path], *args: Any, **kwargs: Any) -> Any:
        if self.proc is not None and self.proc.poll() is None:
            with self.lock:
                self.jobs += 1
                job = self.jobs
            try:
                data = _frame((job, fn.__module__, fn.__qualname__, args, kwargs))
            except Exception as exc:  # an argument that does not pickle: draw it here
                log.warning("figure %s drawn in-process (%s)", fn.__name__, exc)
            else:
                future: Future = Future()
                with self.lock:
                    self.pending[job] = future
                self.outbox.put((job, data))
                return Fallback(future, fn, args, kwargs)
        return _Done(fn(*args, **kwargs))

    def draw(self, plot: Callable[..., Path], *args: Any, **kwargs: Any) -> Callable[[], Path]:
        """``plot(*args, **kwargs)`` (a plot function of armorlab.analysis.plots), drawn by the
        worker; returns a function that waits for the PNG's path."""
        return self.submit(plot, *args, **kwargs).result

    def close(self) -> None:
        """End of requests: the worker's loop ends and it exits at once (no teardown)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            self.outbox.put(None)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Fallback:
    """A worker's answer; the figure is drawn in-process if the worker died before answering."""

    def __init__(self, future: Any, fn: Callable[..., Path], args: tuple, kwargs: dict) -> None:
        self.future, self.fn, self.args, self.kwargs = future, fn, args, kwargs

    def result(self) -> Path:
        try:
            return self.future.result()
        except WorkerDied as exc:
            log.warning("%s: drawing %s in-process", exc, self.fn.__name__)
            return self.fn(*self.args, **self.kwargs)




class _Done:
    """A figure drawn in-process, shaped like a future."""

    def __init__(self, value: Path) -> None:
        self.value = value

    def result(self) -> Path:
        return self.value
