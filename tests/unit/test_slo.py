"""The one SLO: limits in seconds that check themselves, one parser for ``ttft:MS,itl:MS``, a
run judged at a percentile and a request judged for goodput."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pdscope.cli.doctor import doctor_slo
from pdscope.doctor.run import DEFAULT_SLO, DoctorConfig
from pdscope.errors import InputError
from pdscope.load import BenchConfig
from pdscope.slo import SLO, parse_slo


@pytest.mark.parametrize("kwargs, words", [
    ({}, "at least one objective: ttft_s, itl_s, tpot_s or e2e_s"),
    ({"ttft_s": 0.0}, "ttft_s must be a positive number of seconds"),
    ({"itl_s": -0.1}, "itl_s must be a positive number of seconds"),
    ({"tpot_s": math.inf}, "tpot_s must be a positive number of seconds"),
    ({"e2e_s": math.nan}, "e2e_s must be a positive number of seconds"),
    ({"ttft_s": "1"}, "ttft_s must be a positive number of seconds"),
    ({"ttft_s": 1.0, "percentile": 0}, "above 0 and at most 100"),
    ({"ttft_s": 1.0, "percentile": 101}, "above 0 and at most 100"),
    # A bool is an int to Python: True would otherwise be a limit of one second.
    ({"ttft_s": True}, "ttft_s must be a positive number of seconds"),
    ({"itl_s": False}, "itl_s must be a positive number of seconds"),
    ({"ttft_s": 1.0, "percentile": True}, "above 0 and at most 100"),
    ({"ttft_s": 1.0, "percentile": math.nan}, "above 0 and at most 100"),
    ({"ttft_s": -math.inf}, "ttft_s must be a positive number of seconds"),
])
def test_a_bad_slo_names_its_field_in_library_words(kwargs: dict, words: str) -> None:
    with pytest.raises(InputError, match=words) as info:
        SLO(**kwargs)
    assert "--" not in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("text, want", [
    ("ttft:2000,itl:200", SLO(ttft_s=2.0, itl_s=0.2)),
    ("ttft:500,tpot:50", SLO(ttft_s=0.5, tpot_s=0.05)),
    (" TTFT : 1000 , E2E:5000", SLO(ttft_s=1.0, e2e_s=5.0)),
    ("e2el:5000", SLO(e2e_s=5.0)),  # vllm bench serve's name
    ("ttft:1000,itl:100,tpot:80,e2e:9000", SLO(1.0, 0.1, 0.08, 9.0)),
    ("ttft:1000,ttft:300", SLO(ttft_s=0.3)),  # the later one on a latency wins
    ("itl:1e2", SLO(itl_s=0.1)),
])
def test_the_parser_reads_milliseconds_into_seconds(text: str, want: SLO) -> None:
    got = parse_slo(text)
    assert got == want and got.percentile == 99


@pytest.mark.parametrize("text, words", [
    ("latency:5", "use ttft:MS,itl:MS,tpot:MS,e2e:MS"),
    ("ttft", "use ttft:MS"),
    ("", "use ttft:MS"),
    ("ttft:500,", "use ttft:MS"),
    ("ttft:fast", "the limit is a number of milliseconds"),
    ("ttft:", "the limit is a number of milliseconds"),
    ("ttft:0", "positive number of milliseconds"),
    ("ttft:-5", "positive number of milliseconds"),
    ("itl:inf", "positive number of milliseconds"),
    ("itl:nan", "positive number of milliseconds"),
])
def test_the_parser_refuses_what_is_not_an_objective(text: str, words: str) -> None:
    with pytest.raises(InputError, match=words) as info:
        parse_slo(text)
    assert repr(text.split(",")[-1] if "," in text else text) in str(info.value)


def test_a_caller_that_judges_fewer_latencies_lists_only_those() -> None:
    with pytest.raises(InputError, match=r"'tpot:50': use ttft:MS,itl:MS \("):
        parse_slo("tpot:50", ("ttft", "itl"))
    with pytest.raises(InputError, match="use ttft:MS,tpot:MS,e2e:MS"):
        parse_slo("itl:50", ("ttft", "tpot", "e2e"))
    assert parse_slo("e2el:100", ("ttft", "tpot", "e2e")) == SLO(e2e_s=0.1)


@pytest.mark.parametrize("ms", ["0.3", "4.35", "123.456", "0.001", "2000", "1e-3", "99.99",
                                "33.333333"])
def test_the_milliseconds_given_come_back_exactly(ms: str) -> None:
    assert parse_slo(f"ttft:{ms},itl:{ms}").limits_ms() == {"ttft": float(ms), "itl": float(ms)}


def test_an_slo_round_trips_through_json() -> None:
    slo = SLO(ttft_s=1.5, e2e_s=9.0, percentile=90)
    data = json.loads(json.dumps(slo.to_json()))
    assert data == {"ttft_s": 1.5, "e2e_s": 9.0, "percentile": 90}
    assert SLO.from_json(data) == slo
    with pytest.raises(InputError, match="no ttft_ms"):
        SLO.from_json({"ttft_ms": 1500})


def test_a_request_at_its_limits_meets_them_and_one_token_has_no_tpot_to_miss() -> None:
    slo = parse_slo("ttft:500,tpot:50,e2el:1000")
    assert slo.met_by_request(ttft_s=0.5, tpot_s=0.05, e2e_s=1.0, output_tokens=10)
    assert not slo.met_by_request(ttft_s=0.501, tpot_s=0.05, e2e_s=1.0, output_tokens=10)
    assert slo.met_by_request(ttft_s=0.1, tpot_s=None, e2e_s=0.2, output_tokens=1)
    assert not slo.met_by_request(ttft_s=0.1, tpot_s=None, e2e_s=0.2, output_tokens=5)
    assert not slo.met_by_request(ttft_s=None, tpot_s=0.01, e2e_s=0.2, output_tokens=5)
    with pytest.raises(InputError, match="no one ITL"):
        SLO(itl_s=0.1).met_by_request(ttft_s=0.1, tpot_s=0.01, e2e_s=0.2, output_tokens=5)


def test_a_bench_refuses_an_itl_objective_for_goodput() -> None:
    with pytest.raises(InputError, match="no one ITL"):
        BenchConfig(slo=SLO(ttft_s=1.0, itl_s=0.1))
    assert BenchConfig(slo=SLO(ttft_s=1.0)).slo == SLO(ttft_s=1.0)


def test_the_doctor_judges_ttft_and_itl_at_p99_and_keeps_its_json() -> None:
    assert DoctorConfig().slo == SLO(ttft_s=2.0, itl_s=0.2) == DEFAULT_SLO
    for bad, words in ((SLO(ttft_s=1.0), "both ttft_s and itl_s"),
                       (SLO(ttft_s=1.0, itl_s=0.1, tpot_s=0.1), "cannot hold tpot_s"),
                       (SLO(ttft_s=1.0, itl_s=0.1, percentile=90), "must be 99")):
        with pytest.raises(InputError, match=words):
            DoctorConfig(slo=bad)
    data = DoctorConfig(slo=parse_slo("ttft:500,itl:50"), out=Path("x")).to_json()
    assert (data["slo_ttft_ms"], data["slo_itl_ms"]) == (500.0, 50.0) and "slo" not in data
    keys = list(data)
    assert keys.index("slo_ttft_ms") + 1 == keys.index("slo_itl_ms") < keys.index("out")


def test_the_doctor_s_slo_flag_keeps_the_default_for_what_it_leaves_out() -> None:
    assert doctor_slo("ttft:500") == SLO(ttft_s=0.5, itl_s=0.2)
    assert doctor_slo("itl:50") == SLO(ttft_s=2.0, itl_s=0.05)
    with pytest.raises(InputError, match=r"^--slo: bad objective 'tpot:50': use ttft:MS,itl:MS"):
        doctor_slo("tpot:50")


@pytest.mark.parametrize("data, words", [
    ([1.0], "an SLO is a JSON object of objectives"),
    ("ttft:500", "an SLO is a JSON object of objectives"),
    (None, "an SLO is a JSON object of objectives"),
    ({"ttft_s": True}, "ttft_s must be a positive number of seconds"),
    ({"ttft_s": -1}, "ttft_s must be a positive number of seconds"),
    ({"ttft_s": 0.5, "speed_s": 1}, "an SLO has no speed_s"),
])
def test_an_slo_read_from_json_checks_itself_in_one_line(data: object, words: str) -> None:
    with pytest.raises(InputError, match=words) as info:
        SLO.from_json(data)
    assert "\n" not in str(info.value)
