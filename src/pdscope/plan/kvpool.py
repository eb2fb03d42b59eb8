"""The KV pool: blocks held by running requests, cached prefixes, and eviction.

Counts, not blocks: ``used`` blocks are held by running requests (their own, and the prefixes
they share, counted once); a cached prefix that no running request holds is *evictable*: it
counts as free, and the pool takes it back, least recently released first, when it runs short of
blocks that hold nothing (vLLM's free-block queue with prefix caching: a freed cached block stays
findable until it is reused). A prefix is evicted whole, where vLLM evicts block by block.
"""

from __future__ import annotations

from collections import OrderedDict

# A pool without limit is a pool too large to fill.
UNLIMITED = 1 << 62


class BlockPool:
    """``total`` blocks (``None``: without limit)."""

    def __init__(self, total: int | None) -> None:
        self.limited = total is not None
        self.total = UNLIMITED if total is None else total
        self.used = 0
        self.peak = 0
        self.evictable: OrderedDict[int, int] = OrderedDict()  # group -> blocks, LRU first
        self.evictable_blocks = 0
        self.refs: dict[int, int] = {}  # group -> running requests sharing its prefix
        self.blocks: dict[int, int] = {}  # group -> blocks of its cached prefix

    def free(self) -> int:
        """Blocks a request may get: nothing in them, or an evictable prefix."""
        return self.total - self.used

    def uncached_free(self) -> int:
        """Blocks with nothing in them: taking them evicts nothing."""
        return self.total - self.used - self.evictable_blocks

    def is_cached(self, group: int) -> bool:
        return group in self.refs or group in self.evictable

    def touch_cost(self, group: int) -> int:
        """Free blocks a hit on ``group``'s cached prefix takes out of the free count."""
        return self.evictable.get(group, 0)

    def take(self, n: int) -> None:
        """Give ``n`` blocks to a running request (the caller checked ``free()``), evicting
        cached prefixes where the blocks that hold nothing do not suffice."""
        while self.uncached_free() < n:
            group, blocks = self.evictable.popitem(last=False)
            self.evictable_blocks -= blocks
            del self.blocks[group]
        self.used += n
        if self.used > self.peak:
            self.peak = self.used

    def touch(self, group: int) -> None:
        """A request shares ``group``'s cached prefix (the caller checked the cost)."""
        if group in self.evictable:
            blocks = self.evictable.pop(group)
            self.evictable_blocks -= blocks
            self.used += blocks
            self.refs[group] = 1
            if self.used > self.peak:
                self.peak = self.used
        else:
            self.refs[group] += 1

    def adopt(self, group: int, blocks: int) -> None:
        """A running request's first ``blocks`` now hold ``group``'s prefix: cached from now on,
        shared with the requests that find it."""
        self.refs[group] = 1
        self.blocks[group] = blocks

    def extend(self, group: int, blocks: int) -> None:
        """The one running request that shares ``group``'s prefix makes its first ``blocks``
        blocks (more than the prefix has) the group's prefix: they are counted under the group
        from now on, still once (a conversation's turn whose answer the next turn starts with)."""
        self.blocks[group] = blocks

    def release(self, own_blocks: int, group: int | None) -> None:
        """A request leaves (finished or preempted): its own blocks are free, and its share of
        ``group``'s prefix, the last one, makes that prefix evictable."""
        self.used -= own_blocks
        if group is None:
            return
        left = self.refs[group] - 1
        if left:
            self.refs[group] = left
            return
        del self.refs[group]
        blocks = self.blocks[group]
        self.evictable[group] = blocks
        self.evictable_blocks += blocks
        self.used -= blocks
