"""The engine: one server stepping through its batch, under one of the two scheduling policies
(:mod:`pdscope.plan.scheduler` says what each does).

A step starts when the last one ends. The policy decides its composition — one token for each
decoding sequence, chunks of prompts — and the step model its duration; its tokens come out at
its end: one for each decoding sequence, and the first token (or, after a preemption, the next)
of each request whose prompt's last chunk was in the step.

Decode runs. Between two events (an arrival, a finish, a prefill, a KV block the pool cannot
give) every step holds the same sequences, each a token further: the step's context grows by
the number of sequences, so its duration grows by the same amount each step, and ``k`` steps
take an arithmetic series. The engine then takes ``k`` steps as one *run*, ``k`` up to the next
finish or KV shortage, and cuts the run short when a request arrives in the middle (its steps are
in closed form, so the step where the request is admitted is known). One step at a time
(``fast=False``) and runs give the same steps; runs only skip the bookkeeping in between.

The decoding sequences are kept as sums, so that a step costs the same whatever the batch: their
count, the sum of ``prompt + base`` (a sequence's context in a step is ``prompt + base + D`` where
``D`` counts the decode steps so far) and a heap of the value of ``D`` at which each finishes.

Disaggregated (:mod:`pdscope.plan.disaggregation`), an engine is a prefill instance
(``hands_off``: a request leaves it with its first token, its KV cache handed to the link) or a
decode instance, to which requests come with their prompt's KV cache (:meth:`Engine.receive`):
admitted, such a request joins the decoding sequences at once, without a prompt chunk. The step
it joins in is a step of its own (never part of a run), and its gap for the request runs from
the request's first token.
"""

from __future__ import annotations

import heapq
import math
from bisect import insort
from collections import deque

from pdscope.plan.kvpool import BlockPool
from pdscope.plan.ledger import Ledger
from pdscope.plan.scheduler import SchedulerConfig
from pdscope.plan.stepmodel import StepModel


class Stats:
    """What the engines tell the result, across replicas: decode runs (first step's duration,
    its growth a step, steps, sequences decoding), busy time and sequence-seconds, the waiting
    count and its peak."""

    def __init__(self) -> None:
        self.run_first_s: list[float] = []
        self.run_growth_s: list[float] = []
        self.run_steps: list[int] = []
        self.run_decoding: list[int] = []
        self.busy_s = 0.0
        self.sequence_s = 0.0
        self.waiting = 0
        self.max_waiting = 0
        self.finished: list[tuple[int, float]] = []  # (request, time), in finishing order
        self.handed_off: list[tuple[int, float]] = []  # disaggregated: (request, first token)


class Engine:
    """One replica. Subclasses are the policies: they compose a step (:meth:`_compose`), let a
    request go (:meth:`_release`) and may limit a run (:meth:`_run_length`)."""

    def __init__(self, index: int, ledger: Ledger, model: StepModel, stats: Stats,
                 fast: bool) -> None:
        self.index = index
        self.ledger = ledger
        self.stats = stats
        self.fast = fast
        (self.base_s, self.prompt_s, self.sequence_s, self.context_s,
         self.pair_s) = model.coefficients
        self.waiting: deque[int] = deque()
        self.unfinished = 0  # routed here and not finished: what the router balances
        # The decoding sequences, as sums (see the module's docstring).
        self.decoding = 0
        self.context_base = 0
        self.counter = 0
        self.finishes: list[tuple[int, int, int]] = []  # (counter at finish, request, stint)
        # The step (or run of steps) in flight.
        self.busy = False
        self.version = 0  # bumped when a run is cut short: the router's heap entry goes stale
        self.start_s = 0.0
        self.first_step_s = 0.0
        self.growth_s = 0.0
        self.steps = 0
        self.end_s = 0.0
        self.sequences = 0
        self.chunks: list[tuple[int, int]] = []  # (request, prompt tokens) computed in the step
        # Disaggregation: a prefill instance hands each request off at its first token; a
        # decode instance receives requests whose prompt's KV cache came over the link.
        self.hands_off = False
        self.with_kv: set[int] = set()  # waiting here with their prompt's KV cache
        self.joining: list[int] = []  # joined the decoding sequences in the step in flight

    # ---------------------------------------------------------------- what the router calls

    def arrive(self, r: int, t: float) -> bool:
        """Request ``r`` joins this replica's queue at ``t``; ``True`` when that cut the run in
        flight short (its end moved earlier)."""
        self.unfinished += 1
        return self._enqueue(r, t)

    def receive(self, r: int, t: float) -> bool:
        """Request ``r``'s prompt's KV cache arrives at ``t`` (``r`` was counted among this
        instance's unfinished requests when the transfer began); as :meth:`arrive`."""
        self.with_kv.add(r)
        return self._enqueue(r, t)

    def _enqueue(self, r: int, t: float) -> bool:
        self.waiting.append(r)
        stats = self.stats
        stats.waiting += 1
        if stats.waiting > stats.max_waiting:
            stats.max_waiting = stats.waiting
        if self.busy and self.steps > 1:
            # Admitted at the first step that starts at or after its arrival.
            k = self._first_start_at_or_after(t)
            if k < self.steps:
                self._shorten(k)
                return True
        return False

    def start(self, t: float, limit_s: float) -> float | None:
        """Start the next step at ``t``: its end, or ``None`` with nothing to run. No run goes
        on past a step that ends after ``limit_s``."""
        tokens, pairs, preempted = self._compose(t)
        decoding = self.decoding
        sequences = decoding + len(self.chunks)
        if not sequences:
            return None
        d = (self.base_s + self.prompt_s * tokens + self.sequence_s * sequences
             + self.context_s * (self.context_base + decoding * self.counter)
             + self.pair_s * pairs)
        self.busy = True
        self.start_s = t
        self.first_step_s = d
        self.sequences = sequences
        k = 1
        if self.fast and not self.chunks and not preempted and not self.joining:
            k = self._run_length()
        self.growth_s = self.context_s * decoding
        self.steps = k
        self.end_s = self._at(k)
        if k > 1 and self.end_s > limit_s:
            last = self._first_start_at_or_after(math.nextafter(limit_s, math.inf)) - 1
            self._shorten(max(1, last))
        return self.end_s

    def complete(self) -> None:
        """The step (or run) in flight ends: its tokens come out."""
        ledger = self.ledger
        stats = self.stats
        k = self.steps
        t = self.end_s
        decoding = self.decoding
        before = self.counter
        counter = self.counter = before + k
        busy = t - self.start_s
        stats.busy_s += busy
        stats.sequence_s += self.sequences * busy
        joining = self.joining
        if joining:
            # Their gap runs from their first token, on the prefill instance.
            for r in joining:
                ledger.gaps.append(t - ledger.last_token[r])
            decoding -= len(joining)
            joining.clear()
        if decoding:
            stats.run_first_s.append(self.first_step_s)
            stats.run_growth_s.append(self.growth_s)
            stats.run_steps.append(k)
            stats.run_decoding.append(decoding)
        if k > 1:
            self._grow(before + 1, k - 1)
        self.busy = False
        heap = self.finishes
        stint = ledger.stint
        while heap and heap[0][0] <= counter:
            _, r, s = heapq.heappop(heap)
            if s != stint[r]:
                continue
            self._leave_decoding(r)
            self._finish(r, t, ledger.prompt[r] + ledger.output[r] - 1)
        if self.chunks:
            self._prefilled(t, counter)

    # ---------------------------------------------------------------- runs in closed form

    def _at(self, k: int) -> float:
        """When the run's ``k``-th step ends (the ``k+1``-th starts)."""
        return self.start_s + k * self.first_step_s + self.growth_s * (k * (k - 1) // 2)

    def _first_start_at_or_after(self, x: float) -> int:
        """The first ``j`` (from 1, at most the run's steps) whose step ends at or after ``x``:
        the run's ``j+1``-th step is the first to start then or later."""
        y = x - self.start_s
        d0, g = self.first_step_s, self.growth_s
        if g > 0:
            b = d0 - g / 2
            guess = 2 * y / (b + math.sqrt(b * b + 2 * g * y)) if y > 0 else 0.0
        else:
            guess = y / d0
        k = min(self.steps, max(1, math.ceil(guess)))
        while k > 1 and self._at(k - 1) >= x:
            k -= 1
        while k < self.steps and self._at(k) < x:
            k += 1
        return k

    def _shorten(self, k: int) -> None:
        self.steps = k
        self.end_s = self._at(k)
        self.version += 1

    def _finish_top(self) -> int:
        """Decode steps until the next finish (the decode heap's first entry that is current)."""
        heap = self.finishes
        stint = self.ledger.stint
        while heap[0][2] != stint[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][0] - self.counter

    # ---------------------------------------------------------------- requests coming and going

    def _join_decoding(self, r: int, generated: int, counter: int) -> None:
        ledger = self.ledger
        base = generated - counter
        ledger.base[r] = base
        self.decoding += 1
        self.context_base += ledger.prompt[r] + base
        heapq.heappush(self.finishes, (ledger.output[r] - base, r, ledger.stint[r]))

    def _leave_decoding(self, r: int) -> None:
        self.decoding -= 1
        self.context_base -= self.ledger.prompt[r] + self.ledger.base[r]

    def _prefilled(self, t: float, counter: int) -> None:
        """The step's chunks are computed: a prompt read to its end gives its token."""
        ledger = self.ledger
        computed, target, generated = ledger.computed, ledger.target, ledger.generated
        for r, p in self.chunks:
            c = computed[r] = computed[r] + p
            if c < target[r]:
                self._still_reading(r)
                continue
            self._done_reading(r)
            g = generated[r]
            if g == 0:
                ledger.first[r] = t
            else:
                ledger.gaps.append(t - ledger.last_token[r])
            g = generated[r] = g + 1
            if g >= ledger.output[r]:
                self._finish(r, t, c)
            elif self.hands_off:
                self._hand_off(r, t, c)
            else:
                self._join_decoding(r, g, counter)

    def _finish(self, r: int, t: float, kv_tokens: int) -> None:
        self.ledger.finish[r] = t
        self.ledger.generated[r] = self.ledger.output[r]
        self.unfinished -= 1
        self._release(r, kv_tokens)
        self.stats.finished.append((r, t))

    def _hand_off(self, r: int, t: float, kv_tokens: int) -> None:
        """A prefill instance is done with ``r``: its KV cache leaves for the link."""
        self.unfinished -= 1
        self._release(r, kv_tokens)
        self.ledger.last_token[r] = t
        self.stats.handed_off.append((r, t))

    def _join_with_kv(self, r: int) -> None:
        """``r``, received with its prompt's KV cache and its first token, decodes from this
        step on."""
        self.with_kv.discard(r)
        self.ledger.computed[r] = self.ledger.prompt[r]
        self._join_decoding(r, 1, self.counter)
        self.joining.append(r)

    def _admitted(self) -> None:
        self.stats.waiting -= 1

    # ---------------------------------------------------------------- the policy's part

    def _compose(self, t: float) -> tuple[int, float, bool]:
        """Admit what the policy admits and set ``self.chunks``; the step's prompt tokens,
        attention pairs, and whether it preempted."""
        raise NotImplementedError

    def _release(self, r: int, kv_tokens: int) -> None:
        raise NotImplementedError

    def _still_reading(self, r: int) -> None:
        """``r``'s prompt has more chunks to come."""

    def _done_reading(self, r: int) -> None:
        """``r``'s prompt (or its recomputation) is in the cache."""

    def _run_length(self) -> int:
        """Steps the batch stays as it is, from this one on (at least 1)."""
        return self._finish_top()

    def _grow(self, counter: int, steps: int) -> None:
        """The decoding sequences took ``steps`` more steps from decode step ``counter``."""

    @property
    def peak_kv_usage(self) -> float | None:
        return None


class BudgetEngine(Engine):
    """The ``budget`` policy: a token budget a step, a cap on running requests, chunked prefill
    of at most one partial prompt, a KV pool in blocks with preemption of the last admitted, and
    a prefix cache in that pool."""

    def __init__(self, index: int, ledger: Ledger, model: StepModel, config: SchedulerConfig,
                 stats: Stats, fast: bool) -> None:
        super().__init__(index, ledger, model, stats, fast)
        self.budget = config.max_num_batched_tokens
        self.max_sequences = config.max_num_seqs
        self.block = config.block_size
        self.caching = config.prefix_caching
        blocks = config.kv_blocks
        self.limited = blocks is not None
        self.pool = BlockPool(blocks)
        self.running: dict[int, None] = {}  # admission order: the last is preempted first
        self.partial = -1  # the request whose prompt is half read, if any
        # Decoding sequences by the decode step (modulo the block size) at which each next
        # needs a new KV block; kept only for a limited pool.
        self.phase = [0] * self.block

    # A decoding sequence computes the token at position prompt + base + D in step D, so it
    # needs a new block when that position is the first of a block.
    def _phase_of(self, r: int) -> int:
        return (1 - self.ledger.prompt[r] - self.ledger.base[r]) % self.block

    def _join_decoding(self, r: int, generated: int, counter: int) -> None:
        super()._join_decoding(r, generated, counter)
        if self.limited:
            self.phase[self._phase_of(r)] += 1

    def _leave_decoding(self, r: int) -> None:
        super()._leave_decoding(r)
        if self.limited:
            self.phase[self._phase_of(r)] -= 1

    def _compose(self, t: float) -> tuple[int, float, bool]:
        ledger = self.ledger
        preempted = self._allocate_running(t) if self.limited else False
        chunks: list[tuple[int, int]] = []
        tokens = 0
        pairs = 0.0
        left = self.budget - self.decoding
        part = self.partial
        if part >= 0:
            c = ledger.computed[part]
            p = min(ledger.target[part] - c, left)
            if p > 0:
                chunks.append((part, p))
                tokens += p
                pairs += p * c + p * (p + 1) / 2
                left -= p
                self._maybe_adopt(part, c + p)
        if not preempted and self.waiting:
            tokens, pairs = self._admit(chunks, tokens, pairs, left)
        self.chunks = chunks
        return tokens, pairs, preempted

    def _admit(self, chunks: list[tuple[int, int]], tokens: int, pairs: float, left: int
               ) -> tuple[int, float]:
        """First come, first served, while the budget, the sequence cap and the pool last."""
        ledger = self.ledger
        pool = self.pool
        block = self.block
        running = self.running
        waiting = self.waiting
        limited = self.limited
        with_kv = self.with_kv
        while waiting and left > 0 and len(running) < self.max_sequences:
            r = waiting[0]
            if with_kv and r in with_kv:
                # Its prompt's blocks and its first token's: the KV cache it came with.
                need = -(-(ledger.prompt[r] + 1) // block)
                if limited and need > pool.free():
                    break
                waiting.popleft()
                self._admitted()
                if limited:
                    pool.take(need)
                running[r] = None
                self._join_with_kv(r)
                left -= 1
                continue
            g = ledger.group[r]
            hit = cost = 0
            if g >= 0 and self.caching and pool.is_cached(g):
                hit = pool.blocks[g]
                cost = pool.touch_cost(g)
            cached = hit * block
            p = min(ledger.target[r] - cached, left)
            need = -(-(cached + p) // block) - hit
            if limited and need + cost > pool.free():
                break  # head of line: nothing behind it is admitted either
            waiting.popleft()
            self._admitted()
            if hit:
                pool.touch(g)
                ledger.shared[r] = hit
            if limited:
                pool.take(need)
            ledger.computed[r] = cached
            if not ledger.preemptions[r]:
                ledger.cached[r] = cached
            running[r] = None
            chunks.append((r, p))
            tokens += p
            pairs += p * cached + p * (p + 1) / 2
            left -= p
            self._maybe_adopt(r, cached + p)
        return tokens, pairs

    def _maybe_adopt(self, r: int, allocated_tokens: int) -> None:
        """``r``'s blocks now hold its group's prefix: the prefix is cached from here on."""
        ledger = self.ledger
        g = ledger.group[r]
        if g < 0 or not self.caching or ledger.shared[r]:
            return
        blocks = ledger.prefix[r] // self.block
        if not blocks or allocated_tokens < blocks * self.block or self.pool.is_cached(g):
            return
        if not self.limited:
            self.pool.take(blocks)  # an unlimited pool counts only the prefixes' blocks
        self.pool.adopt(g, blocks)
        ledger.shared[r] = blocks

    def _partial_need(self) -> int:
        """New blocks the partial prompt's next chunk needs."""
        part = self.partial
        if part < 0:
            return 0
        ledger = self.ledger
        c = ledger.computed[part]
        p = min(ledger.target[part] - c, self.budget - self.decoding)
        block = self.block
        return -(-(c + p) // block) - -(-c // block)

    def _allocate_running(self, t: float) -> bool:
        """Blocks for the running requests' tokens of this step; where the pool is short, the
        last admitted are preempted (``True``)."""
        need = (self.phase[self.counter % self.block] if self.decoding else 0) \
            + self._partial_need()
        if need <= self.pool.free():
            if need:
                self.pool.take(need)
            return False
        return self._walk_running(t)

    def _walk_running(self, t: float) -> bool:
        """The running requests in admission order, each given its block or preempting."""
        pool = self.pool
        key = self.counter % self.block
        preempted = False
        for r in list(self.running):
            if r not in self.running:
                break  # preempted as a victim: so is everything after it
            if r == self.partial:
                need = self._partial_need()
            else:
                need = 1 if self._phase_of(r) == key else 0
            while need > pool.free():
                victim = next(reversed(self.running))
                self._preempt(victim, t)
                preempted = True
                if victim == r:
                    break
            else:
                if need:
                    pool.take(need)
        return preempted

    def _preempt(self, r: int, t: float) -> None:
        """``r`` leaves the batch: its blocks are freed and it waits at the front of the queue,
        to be recomputed from its prompt and the tokens it has produced."""
        ledger = self.ledger
        del self.running[r]
        if r == self.partial:
            self.partial = -1
            kv = ledger.computed[r]
        else:
            self._leave_decoding(r)
            generated = ledger.generated[r] = ledger.base[r] + self.counter
            kv = ledger.prompt[r] + generated - 1
            ledger.last_token[r] = t  # it decoded in the step that just ended
            ledger.stint[r] += 1
        self._free_blocks(r, kv)
        ledger.computed[r] = 0
        ledger.target[r] = ledger.prompt[r] + ledger.generated[r]
        ledger.preemptions[r] += 1
        self.waiting.appendleft(r)
        stats = self.stats
        stats.waiting += 1
        if stats.waiting > stats.max_waiting:
            stats.max_waiting = stats.waiting

    def _free_blocks(self, r: int, kv_tokens: int) -> None:
        ledger = self.ledger
        shared = ledger.shared[r]
        own = -(-kv_tokens // self.block) - shared if self.limited else 0
        self.pool.release(own, ledger.group[r] if shared else None)
        ledger.shared[r] = 0

    def _release(self, r: int, kv_tokens: int) -> None:
        del self.running[r]
        if r == self.partial:
            self.partial = -1
        if self.caching and self.ledger.seeds[r]:
            self._seed(r, kv_tokens)
        self._free_blocks(r, kv_tokens)

    def _seed(self, r: int, kv_tokens: int) -> None:
        """``r`` leaves and the next turn of its conversation starts with its sequence: the full
        blocks of its ``kv_tokens`` become its group's cached prefix. vLLM caches a request's
        full blocks as they are computed, its answer's too, and keeps them findable after it
        ends (``KVCacheManager.allocate_slots``: ``cache_blocks`` up to ``min(computed + new,
        request.num_tokens)``, in ``vllm/v1/core/kv_cache_manager.py``); the last sampled token
        was never computed, so a finished request leaves ``prompt + output - 1`` tokens."""
        ledger = self.ledger
        g = ledger.group[r]
        keep = kv_tokens // self.block
        shared = ledger.shared[r]
        if keep <= shared:
            return
        pool = self.pool
        if shared:
            pool.extend(g, keep)
        elif pool.is_cached(g):
            return  # another request holds the group's prefix: leave it be
        else:
            pool.adopt(g, keep)
        if not self.limited:
            pool.take(keep - shared)  # an unlimited pool counts only the prefixes' blocks
        ledger.shared[r] = keep

    def _still_reading(self, r: int) -> None:
        self.partial = r

    def _done_reading(self, r: int) -> None:
        if r == self.partial:
            self.partial = -1

    def _run_length(self) -> int:
        k = self._finish_top()
        if k > 1 and self.limited:
            # A queue held back by the pool stays held back only while nothing is evicted.
            pool = self.pool
            room = pool.uncached_free() if self.waiting else pool.free()
            if -(-(k - 1) // self.block) * self.decoding > room:
                k = min(k, 1 + self._steps_fitting(room))
        return k

    def _steps_fitting(self, room: int) -> int:
        """Decode steps after this one whose new blocks fit in ``room`` blocks."""
        decoding = self.decoding
        block = self.block
        cycles, left = divmod(room, decoding)  # every sequence needs one block a cycle
        steps = cycles * block
        start = self.counter + 1
        phase = self.phase
        taken = 0
        for j in range(block):
            taken += phase[(start + j) % block]
            if taken > left:
                break
            steps += 1
        return steps

    def _grow(self, counter: int, steps: int) -> None:
        if not self.limited:
            return
        block = self.block
        cycles, rest = divmod(steps, block)
        phase = self.phase
        need = cycles * self.decoding + sum(phase[(counter + j) % block] for j in range(rest))
        if need:
            self.pool.take(need)

    @property
    def peak_kv_usage(self) -> float | None:
        return self.pool.peak / self.pool.total if self.limited else None


class SlotsEngine(Engine):
    """The ``slots`` policy: a fixed number of slots, each one sequence with its own context;
    a batch of the decoding slots' tokens and then prompt tokens, in slot order."""

    def __init__(self, index: int, ledger: Ledger, model: StepModel, config: SchedulerConfig,
                 stats: Stats, fast: bool) -> None:
        super().__init__(index, ledger, model, stats, fast)
        self.n_batch = config.n_batch
        self.caching = config.prefix_caching
        n = config.slots
        self.occupant = [-1] * n
        self.slot_group = [-1] * n  # the prefix group of the slot's last prompt
        self.released = [-1] * n  # when each slot was last freed, in order: least recent first
        self.release_count = 0
        self.free_slots = n
        self.group_slot: dict[int, int] = {}  # the slot that last served a group
        self.reading: list[int] = []  # slots reading their prompts, in slot order
        self.slot_of: dict[int, int] = {}

    def _pick_slot(self, g: int) -> int:
        if g >= 0 and self.caching:
            s = self.group_slot.get(g, -1)
            if s >= 0 and self.occupant[s] < 0 and self.slot_group[s] == g:
                return s
        occupant, released = self.occupant, self.released
        return min((s for s in range(len(occupant)) if occupant[s] < 0),
                   key=lambda s: (released[s], s))

    def _compose(self, t: float) -> tuple[int, float, bool]:
        ledger = self.ledger
        waiting = self.waiting
        with_kv = self.with_kv
        while waiting and self.free_slots:
            r = waiting.popleft()
            self._admitted()
            if with_kv and r in with_kv:
                s = self._pick_slot(-1)
                self.occupant[s] = r
                self.slot_group[s] = -1
                self.free_slots -= 1
                self.slot_of[r] = s
                self._join_with_kv(r)
                continue
            g = ledger.group[r]
            s = self._pick_slot(g)
            cached = ledger.prefix[r] if g >= 0 and self.caching and self.slot_group[s] == g \
                else 0
            self.occupant[s] = r
            self.slot_group[s] = g
            if g >= 0:
                self.group_slot[g] = s
            self.free_slots -= 1
            self.slot_of[r] = s
            ledger.computed[r] = cached
            ledger.cached[r] = cached
            insort(self.reading, s)
        chunks: list[tuple[int, int]] = []
        tokens = 0
        pairs = 0.0
        left = self.n_batch - self.decoding
        for s in self.reading:
            if left <= 0:
                break
            r = self.occupant[s]
            c = ledger.computed[r]
            p = min(ledger.target[r] - c, left)
            chunks.append((r, p))
            tokens += p
            pairs += p * c + p * (p + 1) / 2
            left -= p
        self.chunks = chunks
        return tokens, pairs, False

    def _done_reading(self, r: int) -> None:
        self.reading.remove(self.slot_of[r])

    def _release(self, r: int, kv_tokens: int) -> None:
        s = self.slot_of.pop(r)
        self.occupant[s] = -1
        self.released[s] = self.release_count
        self.release_count += 1
        self.free_slots += 1
