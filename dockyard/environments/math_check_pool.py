"""Symbolic answer checks with math-verify, in worker processes killed at a hard deadline.

math-verify's own timeouts use ``signal.alarm``, which works only in a process's main thread; the
environments check answers in worker threads, and sympy on a power tower (``9^{9^{9^{9}}}``)
runs until killed. So each check runs in a child process this pool owns (one pipe each): a check
still running at its deadline gets its worker killed and replaced, and the verdict ``timeout``.
``ProcessPoolExecutor`` cannot do this: it has no way to kill the one process running one task.
"""

from __future__ import annotations

import multiprocessing
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Literal

from dockyard.utils.logging import get_logger

logger = get_logger(__name__)

CheckVerdict = Literal["equal", "not_equal", "unparsed", "timeout", "crashed"]

_READY = "ready"


def _as_latex(text: str) -> str:
    # Models write Python's power operator; LaTeX reads ``x**2`` as ``x^{*}`` times 2.
    return "$" + text.strip().replace("**", "^") + "$"


def _serve(connection: Connection) -> None:
    """A worker's main loop: (answer, truth) in, a :data:`CheckVerdict` out, until EOF."""
    import logging

    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # Timeouts are disabled on purpose (the parent kills at the deadline); its warning says so
    # on every call.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    connection.send(_READY)
    while True:
        try:
            answer, truth = connection.recv()
        except EOFError:
            return
        try:
            gold = parse(_as_latex(truth), extraction_config=configs, parsing_timeout=None)
            target = parse(_as_latex(answer), extraction_config=configs, parsing_timeout=None)
            if not gold or not target:
                verdict: CheckVerdict = "unparsed"
            else:
                equal = verify(gold, target, timeout_seconds=None)
                verdict = "equal" if equal else "not_equal"
        except Exception:  # sympy raises nearly anything on odd input; all mean "unparsed"
            verdict = "unparsed"
        connection.send(verdict)


@dataclass(eq=False)  # identity, so a worker can sit in a set
class _Worker:
    process: BaseProcess
    connection: Connection

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.connection.close()


class MathCheckPool:
    """At most ``max_workers`` checks at once, each in its own worker process (started lazily,
    reused, killed and replaced when a check overruns). Thread-safe; :meth:`close` kills all."""

    def __init__(self, max_workers: int) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        # spawn, not fork: the parent runs threads (asyncio.to_thread, NATS), and a forked child
        # of a threaded process can inherit a held lock.
        self._context = multiprocessing.get_context("spawn")
        self._slots = threading.BoundedSemaphore(max_workers)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._closed = False

    def check(self, answer: str, truth: str, *, timeout_s: float) -> CheckVerdict:
        """math-verify's verdict on ``answer`` against ``truth``, or ``timeout`` after
        ``timeout_s`` seconds of checking (worker start-up is not counted)."""
        with self._slots:
            worker = self._take()
            try:
                worker.connection.send((answer, truth))
                if worker.connection.poll(timeout_s):
                    verdict: CheckVerdict = worker.connection.recv()
                    self._give_back(worker)
                    return verdict
            except (EOFError, OSError):
                logger.warning("math check worker died", pid=worker.process.pid)
                self._discard(worker)
                return "crashed"
            logger.warning(
                "math check timed out; worker killed",
                pid=worker.process.pid,
                timeout_s=timeout_s,
                answer=answer[:80],
            )
            self._discard(worker)
            return "timeout"

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all, self._idle = list(self._all), set(), []
        for worker in workers:
            worker.kill()

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("the math check pool is closed")
            if self._idle:
                return self._idle.pop()
        return self._start()

    def _start(self) -> _Worker:
        parent_end, child_end = self._context.Pipe()
        process = self._context.Process(
            target=_serve, args=(child_end,), name="dockyard-math-check", daemon=True
        )
        process.start()
        child_end.close()
        worker = _Worker(process, parent_end)
        try:
            # Importing math-verify (sympy) takes seconds on a loaded machine; not a check's time.
            if parent_end.recv() != _READY:
                raise RuntimeError("math check worker sent no ready message")
        except EOFError as error:
            worker.kill()
            raise RuntimeError(
                f"math check worker exited while starting (exit code {process.exitcode})"
            ) from error
        with self._lock:
            self._all.add(worker)
            closed = self._closed
        if closed:
            self._discard(worker)
            raise RuntimeError("the math check pool is closed")
        return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        worker.kill()

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
        worker.kill()

    @property
    def worker_pids(self) -> list[int | None]:
        """The live workers' process ids (for tests and diagnostics)."""
        with self._lock:
            return [worker.process.pid for worker in self._all]
