"""The mutable state of one engine instance during a simulation (:class:`Engine`): its requests'
progress by index, its KV blocks (:class:`~.kvcache.BlockPool`), prefix reuse, its waiting queue
and running batch. The engines' schedulers (:mod:`.policies`) read and change it."""

from __future__ import annotations

from collections import deque

from .kvcache import BlockPool
from .scheduler import SchedulerConfig

INF = float("inf")


class Engine:
    """The mutable state of one engine instance during a simulation (requests by index)."""

    def __init__(self, sched: SchedulerConfig, pool: BlockPool, isl, osl, hashes, hit_rate: float, draft: int,
                 hash_block_tokens: int):
        self.cfg = sched
        self.pool = pool
        self.bs = pool.kv.block_size
        self.isl = [int(x) for x in isl]
        self.osl = [int(x) for x in osl]
        n = len(self.isl)
        self.hashes = hashes
        self.hit_rate = hit_rate
        self.hash_tokens = hash_block_tokens
        self.k = draft
        self.gen = [0] * n
        self.comp = [0] * n
        self.own = [0] * n                       # private blocks held
        self.shared: list[list[int]] = [[] for _ in range(n)]  # hash blocks held
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.preemptions = 0
        self.chunked: int | None = None          # SGLang's request in the middle of a chunked prefill
        self.prefilled = [False] * n             # prompt KV computed elsewhere (a disaggregated decode instance)
        ratio = sched.new_token_ratio
        self.ratio = ratio[0] if ratio else 0.0
        self.waited = 0                          # TRT-LLM's batch_wait_iters_count

    @property
    def busy(self) -> bool:
        """Anything to run: requests running or waiting, or SGLang's chunked prefill under way."""
        return bool(self.running or self.waiting or self.chunked is not None)

    # -- KV blocks ---------------------------------------------------------------------------------

    def held(self, i: int) -> int:
        return self.own[i] + len(self.shared[i]) * self.pool.hash_blocks

    def grow(self, i: int, tokens: int) -> bool:
        """Hold blocks for ``tokens`` tokens of request ``i``; False (nothing taken) if they are
        not to be had."""
        need = -(-tokens // self.bs) - self.held(i)
        if need <= 0:
            return True
        if not self.pool.alloc(need):
            return False
        self.own[i] += need
        return True

    def release(self, i: int) -> None:
        self.pool.release(self.own[i])
        self.pool.unref(self.shared[i])
        self.own[i] = 0
        self.shared[i] = []

    def preempt(self, i: int) -> None:
        """Free ``i``'s blocks and requeue it at the front; its prompt and output are recomputed."""
        self.release(i)
        self.comp[i] = 0
        self.prefilled[i] = False
        self.waiting.appendleft(i)
        self.preemptions += 1
        if self.chunked == i:
            self.chunked = None

    # -- prefix reuse ------------------------------------------------------------------------------

    def start_prefix(self, i: int) -> None:
        """On admission, skip the cached leading blocks of ``i``'s prompt (at least one token is
        always computed, as vLLM recomputes the last token of a fully cached prompt)."""
        if self.comp[i]:
            return
        total = self.isl[i] + self.gen[i]
        if self.hashes is not None:
            full = self.hashes[i][: self.isl[i] // self.hash_tokens]
            hits = self.pool.match(full)
            while hits and hits * self.hash_tokens >= total:
                hits -= 1
            if hits:
                self.pool.acquire(full[:hits])
                self.shared[i] = list(full[:hits])
                self.comp[i] = hits * self.hash_tokens
        elif self.hit_rate:
            cached = int(self.hit_rate * (self.isl[i] // self.bs)) * self.bs
            while cached and cached >= total:
                cached -= self.bs
            self.comp[i] = cached

    def admit(self, i: int, tokens: int) -> bool:
        """Move the head of the waiting queue, ``i``, into the running batch holding blocks for
        ``tokens`` tokens; False (its prefix hits given back, the queue unchanged) if the blocks
        are not to be had."""
        if not self.grow(i, tokens):
            self.undo_prefix(i)
            return False
        self.waiting.popleft()
        self.running.append(i)
        return True

    def undo_prefix(self, i: int) -> None:
        """A request not admitted after all gives its prefix hits back."""
        if self.own[i] == 0 and not self.prefilled[i]:
            self.pool.unref(self.shared[i])
            self.shared[i] = []
            self.comp[i] = 0

    def publish(self, i: int) -> None:
        """After ``i``'s prompt is computed its full hash blocks become shareable."""
        if self.hashes is None:
            return
        hb = self.pool.hash_blocks
        for h in self.hashes[i][len(self.shared[i]): self.isl[i] // self.hash_tokens]:
            if self.own[i] >= hb and self.pool.publish(h):
                self.own[i] -= hb
                self.shared[i].append(h)

    # -- state -------------------------------------------------------------------------------------

    def need(self, i: int) -> int:
        return self.isl[i] + self.gen[i] - self.comp[i]

    def decoding(self, i: int) -> bool:
        return self.gen[i] > 0 and self.isl[i] + self.gen[i] - self.comp[i] == 1

    def decode_tokens(self, i: int) -> int:
        """Tokens a decoding request computes in a step: its last token plus the drafts."""
        return 1 + self.k

    def max_seqs(self) -> float:
        return self.cfg.max_num_seqs or INF
