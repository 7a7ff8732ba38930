"""How requests reach an engine's scheduler: the take-in lag of a loop one step ahead of the device
(:class:`_Sent`) and SGLang's ``--scheduler-recv-interval`` (:class:`_Inbox`). Shared by the event
simulation of one engine instance (:mod:`.sim`) and of coupled attention-DP ranks (:mod:`.sim_dp`)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .policies import Engine


class _Sent:
    """Requests sent but not yet seen by the scheduler (:attr:`SchedulerConfig.take_in_lag`):
    one a closed-loop client sends on the outputs of step ``s`` joins the queue once step
    ``s + lag`` has run; one that arrived while step ``s`` ran, once step ``s + lag − 1`` has (a
    synchronous loop: at once, as the next step is scheduled). An idle engine takes everything in
    at once (its loop waits on the request socket)."""

    def __init__(self, queue: list, lag: int):
        self.queue, self.lag = queue, lag
        self.due: deque = deque()   # (step count after which it joins, request), in order

    def sent_on_output(self, i: int, steps: int) -> None:
        self.due.append((steps + self.lag, i))

    def arrived(self, i: int, steps: int) -> None:
        self.due.append((steps + self.lag - 1, i))

    def release(self, steps: int, idle: bool) -> None:
        due = self.due
        while due and (idle or due[0][0] <= steps):
            self.queue.append(due.popleft()[1])

    def left(self, steps: int) -> int | None:
        """Steps until the next request joins (None: none is waiting to)."""
        return max(self.due[0][0] - steps, 1) if self.due else None


class _Inbox:
    """SGLang's ``--scheduler-recv-interval`` N (``SchedulerRecvSkipper``, python/sglang/srt/managers/
    scheduler_recv_skipper.py): a sent request waits in the scheduler's socket until
    ``Scheduler.recv_requests`` takes it in, which it does when a counter reaches N — each decode
    step adds 1, any step that prefilled 1000 (so the next loop takes in), a take-in resets it to 0.
    An engine with nothing to run takes in at once (its idle loop's own time is not modelled)."""

    def __init__(self, interval: int):
        self.n = interval
        self.count = interval          # nothing run yet: the first loop takes in
        self.held: list[int] = []

    def due(self) -> bool:
        return self.count >= self.n

    def take(self, eng: Engine) -> None:
        eng.waiting.extend(self.held)
        self.held.clear()
        self.count = 0

    def left(self) -> int:
        """Decode steps until the next take-in."""
        return max(self.n - self.count, 1)

    def decoded(self, steps: int) -> None:
        """``steps`` decode steps, each followed by a loop that takes in at N (then with nothing held)."""
        c = self.count + steps
        self.count = c if c <= self.n else (c - 1) % self.n + 1

    def prefilled(self) -> None:
        self.count = self.n

    def stepped(self, planned) -> None:
        """A scheduled step ran ``planned``: a decode step counts 1, any prefill fills the count."""
        if all(d for _, _, d in planned):
            self.decoded(1)
        else:
            self.prefilled()
