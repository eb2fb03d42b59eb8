"""The streaming client: one adapter per API, server detection, and the per-request timing record.

::

    async with new_session() as session:
        info = await detect_server("http://127.0.0.1:8000", session)
        record = await stream_request(session, info.target(), "Hello", max_tokens=64)
        print(record.ttft_s, record.decode_tok_s)

Every figure follows the definitions in :mod:`pdscope.client.record`; where ``t_send`` is taken
is told in :mod:`pdscope.client.session`.
"""

from pdscope.client.detect import (
    ServerInfo,
    ServerKind,
    detect_server,
    detokenize,
    resolve_target,
    token_counter,
    tokenize,
)
from pdscope.client.faults import classify_status, raise_for_record
from pdscope.client.ollama import decode_rate, implausible_prefill, prefill_rate
from pdscope.client.openai import fixed_output_fields
from pdscope.client.record import (
    APIS,
    ERROR_KINDS,
    Api,
    ErrorKind,
    RecordBuilder,
    RequestRecord,
    TokenCountSource,
)
from pdscope.client.request import build_request, stream_request
from pdscope.client.session import Timeouts, new_session, trace_config
from pdscope.client.target import Target, root_url

__all__ = [
    "APIS",
    "ERROR_KINDS",
    "Api",
    "ErrorKind",
    "RecordBuilder",
    "RequestRecord",
    "ServerInfo",
    "ServerKind",
    "Target",
    "Timeouts",
    "TokenCountSource",
    "build_request",
    "classify_status",
    "decode_rate",
    "detect_server",
    "detokenize",
    "fixed_output_fields",
    "implausible_prefill",
    "new_session",
    "prefill_rate",
    "raise_for_record",
    "resolve_target",
    "root_url",
    "stream_request",
    "token_counter",
    "tokenize",
    "trace_config",
]
