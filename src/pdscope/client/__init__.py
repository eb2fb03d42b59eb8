"""The streaming client: one adapter per API, server detection, and the per-request timing record.

::

    async with new_session() as session:
        info = await detect_server("http://127.0.0.1:8000", session)
        record = await stream_request(session, info.target(), "Hello", max_tokens=64)
        print(record.ttft_s, record.decode_tok_s)

Every figure follows the definitions in :mod:`pdscope.client.record`; where ``t_send`` is taken
is told in :mod:`pdscope.client.session`.
"""

from pdscope.client.connection import Connection, connect, open_connection
from pdscope.client.counters import decode_rate, implausible_prefill, prefill_rate
from pdscope.client.detect import (
    ServerInfo,
    choose_target,
    detect_server,
    detokenize,
    resolve_target,
    token_counter,
    tokenize,
)
from pdscope.client.faults import classify_status, raise_for_record
from pdscope.client.options import ClientOptions
from pdscope.client.record import (
    ERROR_KINDS,
    ErrorKind,
    RecordBuilder,
    RequestRecord,
    TokenCountSource,
)
from pdscope.client.request import build_request, stream_request
from pdscope.client.session import Timeouts, new_session, trace_config
from pdscope.client.target import APIS, Api, Target, is_loopback, root_url

__all__ = [
    "APIS",
    "ERROR_KINDS",
    "Api",
    "ClientOptions",
    "Connection",
    "ErrorKind",
    "RecordBuilder",
    "RequestRecord",
    "ServerInfo",
    "Target",
    "Timeouts",
    "TokenCountSource",
    "build_request",
    "choose_target",
    "classify_status",
    "connect",
    "decode_rate",
    "detect_server",
    "detokenize",
    "implausible_prefill",
    "is_loopback",
    "new_session",
    "open_connection",
    "prefill_rate",
    "raise_for_record",
    "resolve_target",
    "root_url",
    "stream_request",
    "token_counter",
    "tokenize",
    "trace_config",
]
