"""The ledger: every simulated request's inputs and what happened to it, shared by the engines
(each request is served by one replica) and read back into a result."""

from __future__ import annotations

import math

from pdscope.plan.demand import Demand

NOT_YET = math.nan


class Ledger:
    """Per-request lists, indexed by the order requests are sent: ``prompt``, ``output``,
    ``group`` (-1: none), ``prefix`` tokens; ``arrival`` (a closed loop fills it in as it
    sends), ``first`` token and ``finish`` times, ``preemptions``, ``replica``; ``gaps`` holds
    the gaps between tokens that are not one step long (a preempted request's wait).

    The engine's own per-request state lives here too, as plain lists (the simulator's inner
    loop indexes them): ``generated`` tokens (kept up to date when a request leaves the decode
    batch; while it decodes, ``base`` + the engine's decode counter gives it), ``computed`` and
    ``target`` (tokens of the prompt, or of the prompt and the answer so far after a preemption,
    in the cache and to be computed), ``shared`` (KV blocks of a cached prefix it shares),
    ``stint`` (bumped at each preemption, to recognise stale entries) and ``last_token`` (when
    a preempted request's last token came).

    ``cached``: prompt tokens the prefix cache served at a request's first admission (what a
    server reports as cached tokens); ``seeds``: the request is followed by one of its prefix
    group (a conversation's next turn), so its KV cache becomes the group's prefix when it
    leaves."""

    def __init__(self, demand: Demand) -> None:
        n = len(demand)
        self.n = n
        self.prompt: list[int] = demand.prompt_tokens.tolist()
        self.output: list[int] = demand.output_tokens.tolist()
        self.group: list[int] = demand.prefix_group.tolist()
        self.prefix: list[int] = demand.prefix_tokens.tolist()
        self.arrival: list[float] = (demand.arrival_s.tolist() if demand.arrival_s is not None
                                     else [NOT_YET] * n)
        self.first: list[float] = [NOT_YET] * n
        self.finish: list[float] = [NOT_YET] * n
        self.preemptions: list[int] = [0] * n
        self.replica: list[int] = [0] * n
        self.gaps: list[float] = []
        self.generated: list[int] = [0] * n
        self.computed: list[int] = [0] * n
        self.target: list[int] = list(self.prompt)
        self.shared: list[int] = [0] * n
        self.base: list[int] = [0] * n
        self.stint: list[int] = [0] * n
        self.last_token: list[float] = [NOT_YET] * n
        self.cached: list[int] = [0] * n
        self.seeds: list[bool] = [False] * n
        if demand.follows is not None:
            for f, r in enumerate(demand.follows.tolist()):
                if r >= 0 and self.group[f] >= 0 and self.group[f] == self.group[r]:
                    self.seeds[r] = True
