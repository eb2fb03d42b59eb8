"""A measured connection: one session on a detected server, its target, and prompts fitted to
its tokenizer. Every measurement opens one with :func:`connect` — the experiments, a load run,
the planner's calibration, the doctor — so they detect, choose the target and count tokens the
same way.

A connection handed to :func:`connect` is reused as it was opened: the same session, server,
target and timeouts, never re-targeted with the options of whoever reuses it (the doctor opens
one with its options and every experiment runs on it). Each reuse draws its own prompts (a seed
after the connection's), so two experiments on one connection never send a prompt that a
prefix cache could have kept from the other.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import aiohttp

from pdscope.client.detect import ServerInfo, choose_target, detect_server, token_counter, tokenize
from pdscope.client.faults import raise_for_record
from pdscope.client.options import ClientOptions
from pdscope.client.record import RecordBuilder, RequestRecord
from pdscope.client.request import stream_request
from pdscope.client.session import new_session
from pdscope.client.target import Target
from pdscope.errors import InputError
from pdscope.workload.prompts import CountFn, Prompt, PromptBuilder

CHAT_APIS = ("openai-chat", "ollama-chat")


@dataclass
class Connection:
    """An open session on a detected server, with a prompt builder fitted to its tokenizer.
    ``options`` are those it was opened with; ``seed`` the base seed of the session's prompts
    (each reuse draws from the next one: ``builder.base_seed`` says which)."""

    session: aiohttp.ClientSession
    info: ServerInfo
    target: Target
    builder: PromptBuilder
    options: ClientOptions
    notes: list[str]
    seed: int = 0
    # Prompt streams drawn on this session so far, shared by every reuse of it.
    _reuses: list[int] = field(default_factory=lambda: [0], repr=False)

    @property
    def chat(self) -> bool:
        return self.target.api in CHAT_APIS

    @property
    def count(self) -> CountFn | None:
        """The server's tokenizer as a count of tokens, or ``None`` when it has none."""
        return self.builder.count

    def prompts(self, seed: int) -> PromptBuilder:
        """A prompt builder of its own, from ``seed``, fitted to this server's tokenizer."""
        return PromptBuilder(self.count, base_seed=seed)

    def reuse(self) -> Connection:
        """The same connection (session, server, target, options) with prompts of its own."""
        self._reuses[0] += 1
        seed = self.seed + self._reuses[0]
        return Connection(self.session, self.info, self.target, self.prompts(seed),
                          self.options, list(self.notes), self.seed, self._reuses)

    async def prompt(self, n_tokens: int, index: int, *, prefix: str = "") -> Prompt:
        """A prompt of ``n_tokens`` (by the server's tokenizer where it has one) that no other
        index gives: a prefix cache cannot flatter it (past ``prefix``, kept whole)."""
        return await self.builder.build(n_tokens, index, prefix=prefix)

    async def send(
        self,
        prompt: Prompt,
        max_tokens: int,
        *,
        system: Prompt | None = None,
        watch: Callable[[RecordBuilder], None] | None = None,
        check: bool = True,
    ) -> RequestRecord:
        """Stream one request. For a chat API ``system`` goes as a system message and
        ``prompt`` as the user's; for a completions API the caller has already put any shared
        prefix into ``prompt``. ``watch`` is handed the live record builder as soon as it
        exists (to see tokens arrive while the stream runs). With ``check`` a failed request
        raises :class:`RunError`."""
        if self.chat:
            messages = [{"role": "user", "content": prompt.text}]
            if system is not None:
                messages.insert(0, {"role": "system", "content": system.text})
            record = await stream_request(self.session, self.target, messages=messages,
                                          max_tokens=max_tokens,
                                          timeouts=self.options.timeouts, watch=watch)
        else:
            if system is not None:
                raise InputError("a completions prompt carries its prefix in its text")
            record = await stream_request(self.session, self.target, prompt=prompt.text,
                                          max_tokens=max_tokens,
                                          timeouts=self.options.timeouts, watch=watch)
        record = replace(record, sent_prompt_tokens=prompt.tokens + (system.tokens if system
                                                                     else 0),
                         sent_prompt_estimated=not prompt.exact or (system is not None
                                                                   and not system.exact))
        if check:
            raise_for_record(record)
        if record.prompt_tokens and not prompt.exact and not self.chat and not record.truncated:
            # A prompt the server cut short says nothing of the tokens a word.
            # A chat's count includes its template (and, for some models, a default system
            # prompt): it would bias the tokens-a-word ratio.
            self.builder.calibrate(prompt, record.prompt_tokens)
        return await self.recount(record, prompt, system)

    async def recount(
        self, record: RequestRecord, prompt: Prompt, system: Prompt | None = None
    ) -> RequestRecord:
        """A server that sends no usage (llama-cpp-python): take the prompt count from the
        prompt (fitted to the server's tokenizer) and count the output with that tokenizer."""
        if not record.ok or record.token_count_source != "chunks-estimate":
            return record
        if self.info.tokenize_endpoint is None:
            return record
        ids = await tokenize(self.info, self.session, record.output_text,
                             api_key=self.target.api_key, model=self.target.model)
        if ids is None:
            return record
        prompt_tokens = record.prompt_tokens
        if prompt.exact and (system is None or system.exact):
            prompt_tokens = prompt.tokens + (system.tokens if system else 0)
        return replace(record, prompt_tokens=prompt_tokens, output_tokens=len(ids),
                       token_count_source="server-tokenizer")


@asynccontextmanager
async def connect(where: str | Connection, options: ClientOptions, *,
                  limit: int = 256) -> AsyncIterator[Connection]:
    """A :class:`Connection` to the server at ``where`` with ``options``: a URL is detected
    (``options.api_key``, and the request fields' headers on every request of the session), its
    model checked and its target chosen by ``options``, on a session
    of ``limit`` connections. An open connection is reused as it was opened (its session,
    server, target and timeouts: ``options`` are not applied to it), with prompts of its own.

    Raises :class:`RunError` (one line) when nothing answers or the model is not served."""
    if isinstance(where, Connection):
        yield where.reuse()
        return
    async with new_session(limit=limit,
                           headers=options.request_fields.header_map()) as session:
        info = await detect_server(where, session, api_key=options.api_key)
        yield open_connection(session, info, options)


def open_connection(session: aiohttp.ClientSession, info: ServerInfo,
                    options: ClientOptions) -> Connection:
    """A :class:`Connection` on a server already detected: the target ``options`` choose, and
    prompts from ``options.seed`` (``None``: a new seed)."""
    target = choose_target(info, model=options.model, api=options.api, api_key=options.api_key,
                           fixed_output=options.fixed_output, fields=options.request_fields)
    notes: list[str] = []
    count = token_counter(info, session, target)
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1 << 30)
    if count is None:
        notes.append("the server has no tokenizer endpoint: prompt lengths were estimated"
                     " and calibrated from the reported prompt_tokens")
    elif target.api in CHAT_APIS:
        notes.append("message texts are of exact length by the server's tokenizer; the"
                     " chat template adds its own tokens (in the reported prompt_tokens)")
    return Connection(session, info, target, PromptBuilder(count, base_seed=seed), options,
                      notes, seed)
