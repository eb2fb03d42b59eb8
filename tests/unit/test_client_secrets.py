"""An API key goes to the server and nowhere else: not into records, errors or reprs."""

from __future__ import annotations

import pytest
from aiohttp import web

from pdscope.client import (
    Api,
    RequestRecord,
    Target,
    Timeouts,
    new_session,
    raise_for_record,
    stream_request,
)
from pdscope.errors import RunError
from pdscope.selftest import ReferenceConfig, ReferenceServer
from tests.unit.test_client_support import Handler, app_server, run

KEY = "sk-pdscope-secret-0123456789"


def echo_auth(status: int, stream: bool = False) -> Handler:
    """A careless server that repeats the Authorization header back in its answer."""

    async def handler(request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        if not stream:
            return web.json_response({"error": {"message": f"bad credentials {auth}"}},
                                     status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(f'data: {{"choices":[{{"text":"hi {auth}"}}]}}\n\n'.encode())
        await resp.write(f'data: {{"error": {{"message": "died holding {auth}"}}}}\n\n'.encode())
        await resp.write_eof()
        return resp

    return handler


def records_from_echoing_server() -> list[RequestRecord]:
    async def main() -> list[RequestRecord]:
        routes = {
            ("POST", "/v1/completions"): echo_auth(401),
            ("POST", "/v1/chat/completions"): echo_auth(500),
            ("POST", "/api/generate"): echo_auth(200, stream=True),
        }
        async with app_server(routes) as url, new_session() as session:
            out = []
            apis: tuple[Api, ...] = ("openai", "openai-chat", "ollama")
            for api in apis:
                t = Target(url, api, "m", api_key=KEY)
                out.append(await stream_request(session, t, "hi", timeouts=Timeouts(total=5)))
            return out

    return run(main())


@pytest.mark.timeout(30)
def test_the_key_is_in_no_record_and_no_error_message() -> None:
    records = records_from_echoing_server()
    assert [r.error_kind for r in records] == ["auth", "http_5xx", "bad_chunk"]
    for r in records:
        assert KEY not in r.to_json()
        assert KEY not in repr(r)
        with pytest.raises(RunError) as err:
            raise_for_record(r)
        assert KEY not in str(err.value)
    assert "bad credentials Bearer ***" in (records[0].error or "")


@pytest.mark.timeout(30)
def test_the_key_reaches_the_server_and_a_mid_stream_error_does_not_leak_it() -> None:
    async def main() -> tuple[RequestRecord, RequestRecord]:
        chat_routes = {("POST", "/v1/chat/completions"): echo_auth(200, stream=True)}
        async with (
            ReferenceServer(ReferenceConfig(api_key=KEY, ttft_base_s=0.01)) as server,
            app_server(chat_routes) as url,
            new_session() as session,
        ):
            t = Target(server.base_url, "openai", "pdscope-reference", api_key=KEY)
            ok = await stream_request(session, t, "hi", max_tokens=3)
            bad = await stream_request(session, Target(url, "openai-chat", "m", api_key=KEY),
                                       "hi")
            return ok, bad

    ok, bad = run(main())
    assert ok.ok, ok.error
    assert bad.error_kind == "stream_broken"
    assert KEY not in (bad.error or "") and KEY not in bad.to_json()


def test_a_target_does_not_show_its_key() -> None:
    t = Target("http://127.0.0.1:8000/v1", "openai", "m", api_key=KEY)
    assert KEY not in repr(t) and KEY not in str(t)
    assert t.base_url == "http://127.0.0.1:8000"
