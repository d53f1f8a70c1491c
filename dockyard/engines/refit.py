"""Coordinating a refit with generation in flight (used by the torch engine).

The engine's model is claimed by one user at a time (a generation batch or a refit). A refit
requested while a generation holds the model is queued as *pending*; the generation applies it
between decode steps (``continue_on_new``) or when it finishes (``finish_on_old``). Either way
every token records the version of the weights that computed its distribution. A newer pending
refit supersedes an older one that has not been applied yet.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

RefitOutcome = Literal["pending", "applied", "superseded", "failed"]
State = TypeVar("State")


@dataclass
class RefitTicket(Generic[State]):
    """A requested refit; ``done`` is set once it was applied, superseded or failed."""

    version: int
    state: State | None
    outcome: RefitOutcome = "pending"
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def finish(self, outcome: RefitOutcome, error: BaseException | None = None) -> None:
        self.outcome = outcome
        self.error = error
        self.state = None  # drop the tensors as soon as they are no longer needed
        self.done.set()


class ModelClaim(Generic[State]):
    """Exclusive use of a model plus a single pending-refit slot.

    ``apply(ticket)`` loads the ticket's state into the model; it always runs in the thread
    that holds the claim, outside the internal lock.
    """

    def __init__(self, apply: Callable[[RefitTicket[State]], None]) -> None:
        self._apply = apply
        self._condition = threading.Condition()
        self._busy = False
        self._pending: RefitTicket[State] | None = None

    def acquire(self) -> None:
        """Block until the model is free, then apply any pending refit before using it."""
        with self._condition:
            while self._busy:
                self._condition.wait()
            self._busy = True
        self.apply_pending()

    def release(self) -> None:
        """Apply what arrived while the model was busy, then free it. Checking for a pending
        refit and clearing ``busy`` happen under one lock, so no request is stranded."""
        while True:
            with self._condition:
                ticket = self._take_pending()
                if ticket is None:
                    self._busy = False
                    self._condition.notify_all()
                    return
            self._run(ticket)

    def apply_pending(self) -> bool:
        """Called by the claim holder between steps; True when new weights were loaded."""
        with self._condition:
            ticket = self._take_pending()
        if ticket is None:
            return False
        self._run(ticket)
        return ticket.outcome == "applied"

    def request(self, ticket: RefitTicket[State]) -> None:
        """Never blocks on a generation: queue the refit if the model is busy, otherwise claim
        the model and apply it in the calling thread."""
        with self._condition:
            if self._pending is not None:
                self._pending.finish("superseded")
            self._pending = ticket
            if self._busy:
                return
            self._busy = True
        self.release()

    @property
    def pending_version(self) -> int | None:
        with self._condition:
            return None if self._pending is None else self._pending.version

    def _take_pending(self) -> RefitTicket[State] | None:
        ticket, self._pending = self._pending, None
        return ticket

    def _run(self, ticket: RefitTicket[State]) -> None:
        try:
            self._apply(ticket)
        except Exception as error:  # reported to whoever awaits the ticket
            ticket.finish("failed", error)
        else:
            ticket.finish("applied")
