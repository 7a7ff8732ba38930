"""The KV cache of one engine instance during a simulation: blocks, and prefix reuse.

Blocks are allocated per request as its tokens are computed (vLLM v1
``KVCacheManager.allocate_slots``) or reserved whole at admission (TRT-LLM GUARANTEED_NO_EVICT);
:mod:`.policies` decides which. Prefix reuse (vLLM ``enable_prefix_caching``, SGLang's radix
cache, TRT-LLM ``enable_block_reuse``) is modelled two ways:

- by hit rate ``H``: a fraction ``H`` of each prompt's full blocks is found cached; those tokens
  are not prefilled (``Chunk.past`` counts them). The request still holds blocks for them — the
  shared copies are not deduplicated, so KV use is an upper bound;
- by block hashes from a trace (``hash_ids``, Mooncake style): a prompt block whose hash is
  resident (held by a running request, or cached after its owner finished) is a hit; the
  leading run of hits is skipped. Blocks of finished requests stay cached until evicted, least
  recently freed first (vLLM ``FreeKVCacheBlockQueue``: freed blocks go to the tail, eviction
  takes the head).
"""

from __future__ import annotations

from collections import OrderedDict

from .types import KVCache


class BlockPool:
    """Free and cached blocks of one KV cache. ``hash_blocks``: engine blocks per trace hash
    block (a Mooncake hash covers 512 tokens)."""

    __slots__ = ("kv", "total", "free", "peak_used", "refs", "lru", "hash_blocks")

    def __init__(self, kv: KVCache, hash_blocks: int = 1):
        self.kv = kv
        self.total = kv.blocks
        self.free = kv.blocks          # neither held nor cached
        self.peak_used = 0
        self.refs: dict[int, int] = {}          # resident hash -> running requests holding it
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached hashes no running request holds
        self.hash_blocks = hash_blocks

    @property
    def available(self) -> int:
        """Blocks an allocation can get: free ones plus cached ones it may evict."""
        return self.free + len(self.lru) * self.hash_blocks

    @property
    def used(self) -> int:
        """Blocks held by running requests (cached, evictable ones not counted)."""
        return self.total - self.available

    def alloc(self, blocks: int) -> bool:
        """Take ``blocks``; evicts least recently freed cached blocks if needed. False (nothing
        taken) if even eviction cannot make room."""
        if blocks <= 0:
            return True
        if blocks > self.available:
            return False
        while self.free < blocks:
            self.lru.popitem(last=False)
            self.free += self.hash_blocks
        self.free -= blocks
        used = self.total - self.available
        if used > self.peak_used:
            self.peak_used = used
        return True

    def release(self, blocks: int) -> None:
        self.free += blocks

    def match(self, hashes: tuple[int, ...]) -> int:
        """How many leading hash blocks of a prompt are resident."""
        n = 0
        for h in hashes:
            if h not in self.refs and h not in self.lru:
                break
            n += 1
        return n

    def acquire(self, hashes: tuple[int, ...]) -> None:
        """A request starts holding these resident hash blocks (a prefix hit)."""
        for h in hashes:
            if h in self.lru:
                del self.lru[h]
                self.refs[h] = 1
            else:
                self.refs[h] += 1

    def publish(self, h: int) -> bool:
        """A request's own computed block becomes shareable under hash ``h``; False if ``h`` is
        already resident (the request keeps its private copy)."""
        if h in self.refs or h in self.lru:
            return False
        self.refs[h] = 1
        return True

    def unref(self, hashes) -> None:
        """A request stops holding these hash blocks; unheld ones stay cached, newest last."""
        for h in hashes:
            n = self.refs[h] - 1
            if n:
                self.refs[h] = n
            else:
                del self.refs[h]
                self.lru[h] = None
