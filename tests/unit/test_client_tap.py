"""The tap: a stream's bytes parsed in the callback that received them, with the same records as
reading it with ``readany()``, and ``readany()`` where the tap cannot be placed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from pdscope.client import http1, tap
from pdscope.client.openai import OpenAIStreamParser
from tests.unit.test_client_faults import request

FAULTS = ["reset_mid_stream", "stall", "malformed_chunk", "never_ending"]


def spy_feeds(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each read the parser is fed: ``True`` when it ran inside a task (``readany()``),
    ``False`` when in the connection's own callback (the tap, or ``client/http1.py``)."""
    seen: list[bool] = []
    feed = OpenAIStreamParser.feed

    def spy(self: OpenAIStreamParser, data: bytes, t_ns: int) -> None:
        seen.append(asyncio.current_task() is not None)
        feed(self, data, t_ns)

    monkeypatch.setattr(OpenAIStreamParser, "feed", spy)
    return seen


@pytest.fixture
def feeds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """:func:`spy_feeds` on aiohttp's path: pdscope's own connections switched off."""
    monkeypatch.setattr(http1, "enabled", False)
    yield spy_feeds(monkeypatch)


def summary(fault: str | None) -> tuple[object, ...]:
    r, _ = request(fault=fault)
    return (r.error_kind, len(r.token_times_ns), r.output_text, r.output_tokens,
            r.finish_reason, bool(r.error) and "\n" not in (r.error or ""))


@pytest.mark.timeout(60)
def test_the_tap_reads_in_the_callback_and_records_what_readany_records(
    feeds: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    tapped = [summary(f) for f in [None, *FAULTS]]
    assert feeds and not any(feeds)  # every read parsed where it was received
    feeds.clear()
    monkeypatch.setattr(tap, "enabled", False)
    read = [summary(f) for f in [None, *FAULTS]]
    assert feeds and all(feeds)
    assert tapped == read
    # The clean stream and each fault as the fault tests expect them, both ways.
    assert [s[:2] for s in tapped] == [(None, 20), ("stream_broken", 3),
                                       ("timeout_between_tokens", 3), ("bad_chunk", 3),
                                       ("overrun", 85)]


@pytest.mark.timeout(30)
def test_a_reader_that_refuses_the_tap_is_read_with_readany(
    feeds: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Wider(aiohttp.StreamReader):  # another layout: the class cannot be swapped in
        __slots__ = ("extra",)

    monkeypatch.setattr(tap, "_Tapped", Wider)
    r, _ = request()
    assert r.error is None and len(r.token_times_ns) == 20
    assert feeds and all(feeds)  # every read parsed in the request's task
