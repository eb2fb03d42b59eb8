"""The ceiling, kv and devices commands, run as a user runs them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import pdscope as pdscope_package
from pdscope import cli
from pdscope.cli import build_parser
from tests.conftest import MODEL_CONFIGS

ARTICLE = [
    ("cpu-ddr5-5600-2ch", "CPU, dual channel DDR5-5600", 90, 6),
    ("a10g", "NVIDIA A10G", 600, 38),
    ("l40s", "NVIDIA L40S", 864, 54),
    ("rtx-4090", "NVIDIA RTX 4090", 1008, 63),
    ("a100-80gb-sxm", "NVIDIA A100 80GB SXM", 2039, 127),
    ("h100-sxm", "NVIDIA H100 SXM", 3350, 209),
]


def pdscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdscope", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(("device_id", "name", "bandwidth", "ceiling"), ARTICLE)
def test_ceiling_json_reproduces_each_row_of_the_article(
    device_id: str, name: str, bandwidth: int, ceiling: int
) -> None:
    r = pdscope("ceiling", "--params", "8e9", "--dtype", "fp16", "--device", device_id, "--json")
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)
    assert {k: row[k] for k in ("device", "mem_bandwidth_gb_s", "decode_ceiling_tok_s")} == {
        "device": name,
        "mem_bandwidth_gb_s": bandwidth,
        "decode_ceiling_tok_s": ceiling,
    }


def test_ceiling_without_devices_prints_the_article_table_in_its_order() -> None:
    r = pdscope("ceiling", "--params", "8e9", "--dtype", "fp16", "--json")
    rows = json.loads(r.stdout)
    assert [(x["device"], x["decode_ceiling_tok_s"]) for x in rows] == [
        (name, c) for _, name, _, c in ARTICLE
    ]
    table = pdscope("ceiling", "--params", "8e9", "--dtype", "fp16", "--device", "h100-sxm")
    assert table.returncode == 0
    assert "209" in table.stdout and "NVIDIA H100 SXM" in table.stdout


def test_ceiling_with_a_model_context_and_batch() -> None:
    cfg = str(MODEL_CONFIGS / "meta-llama__Llama-3.1-8B.json")
    r = pdscope(
        "ceiling", "--model", cfg, "--context", "8000", "--batch", "32", "--device", "l40s",
        "--what-if", "--json",
    )
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)
    assert row["kv_bytes_read_per_token"] == 131072 * 8000
    # Each of the 32 sequences reads its own 1 GB of KV a step; the weights are read once.
    weights = row["weight_bytes_read_per_token"]
    expected = 32 * 864e9 / (weights + 32 * 131072 * 8000)
    assert row["batch"] == 32
    assert row["batch_throughput_tok_s"] == pytest.approx(expected)
    assert row["batch_throughput_tok_s"] > 10 * row["decode_ceiling_tok_s_exact"]
    bits = {w["bits"]: w["speedup"] for w in row["quantization_whatif"]}
    assert bits[8] > 1.5 and bits[4] > bits[8]


def test_ceiling_on_gpu_gives_the_split_ceiling_beside_all_on_the_gpu() -> None:
    # 8B at 4 bits = 4 GB; 63% on an RTX 4090 (1,008 GB/s), 37% in dual channel DDR5-5600
    # (90 GB/s): 2.52 GB / 1,008 GB/s + 1.48 GB / 90 GB/s = 18.94 ms -> 52.8 tok/s, not 252.
    r = pdscope("ceiling", "--params", "8e9", "--dtype", "int4", "--device", "rtx-4090",
                "--on-gpu", "0.63", "--cpu-device", "ddr5-5600-2ch", "--json")
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)
    off = row["offload"]
    assert off["on_gpu"] == 0.63
    assert off["cpu_device_id"] == "cpu-ddr5-5600-2ch"
    assert off["decode_ceiling_tok_s"] == pytest.approx(1 / (2.52e9 / 1008e9 + 1.48e9 / 90e9))
    assert off["decode_all_on_gpu_tok_s"] == pytest.approx(252)
    assert off["prefill_ceiling_tok_s"] is None  # the table's DDR5 row has no FLOPS figure
    assert row["decode_ceiling_tok_s"] == 252  # the row itself is unchanged


def test_ceiling_on_gpu_prints_both_and_skips_devices_that_are_not_gpus() -> None:
    r = pdscope("ceiling", "--params", "8e9", "--dtype", "fp16", "--on-gpu", "0.63",
                "--cpu-device", "ddr5-5600-2ch")
    assert r.returncode == 0, r.stderr
    assert "63% of the weights in GPU memory and 37% in system" in r.stdout
    row = next(line for line in r.stdout.splitlines() if "RTX 4090" in line
               and "13.2" in line)
    assert "63" in row  # all on the GPU: the article's 63 tok/s; split: 13.2
    assert "not GPUs have no split ceiling" in r.stderr


def test_ceiling_on_gpu_measures_this_machine_s_cpu_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import replace

    from pdscope import hardware

    cpu = replace(hardware.find_device("ddr5-5600-2ch"), id="local-cpu", name="this CPU",
                  mem_bandwidth_gb_s=50.0, bf16_tflops=1.0, measured=True)
    monkeypatch.setattr(hardware, "measure_local_cpu", lambda: cpu)
    assert cli.main(["ceiling", "--params", "8e9", "--dtype", "int4", "--device", "rtx-4090",
                     "--on-gpu", "0.5", "--json"]) == 0
    off = json.loads(capsys.readouterr().out)[0]["offload"]
    assert off["cpu_device"] == "this CPU" and off["cpu_measured"] is True
    assert off["decode_ceiling_tok_s"] == pytest.approx(1 / (2e9 / 1008e9 + 2e9 / 50e9))
    assert off["prefill_ceiling_tok_s"] is not None


def test_kv_with_slots_says_when_their_kv_pushes_the_weights_off_the_gpu() -> None:
    cfg = str(MODEL_CONFIGS / "meta-llama__Llama-3.1-8B.json")
    args = ("kv", "--model", cfg, "--context", "8192", "--device", "rtx-4090")
    one = pdscope(*args, "--slots", "1", "--json")
    eight = pdscope(*args, "--parallel", "8", "--json")
    assert one.returncode == 0 and eight.returncode == 0, one.stderr + eight.stderr
    a, b = json.loads(one.stdout), json.loads(eight.stdout)
    assert b["slots_kv_bytes"] == 8 * 131072 * 8192 == 8 * a["slots_kv_bytes"]
    assert a["devices"][0]["weights_spill"] is False
    assert b["devices"][0]["weights_spill"] is True
    assert b["devices"][0]["weights_on_gpu_beside_slots"] < 1
    text = pdscope(*args, "--slots", "8")
    assert "KV of 8 slots: 8.59 GB" in text.stdout
    assert "system RAM" in text.stdout and "--on-gpu 0.78" in text.stdout


def test_kv_json_for_the_articles_8b_example() -> None:
    r = pdscope("kv", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                "--context", "8000", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kv_bytes_per_token"] == 131072
    assert out["kv_bytes_per_request"] == 131072 * 8000  # about 1 GB


def test_kv_json_with_a_device_gives_the_pool_and_moe_parameter_counts() -> None:
    cfg = str(MODEL_CONFIGS / "openai__gpt-oss-20b.json")
    r = pdscope("kv", "--model", cfg, "--context", "8000", "--device", "h100-sxm", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("kv_bytes_per_token", "kv_bytes_per_request", "max_concurrent_sequences",
                "parameters", "active_parameters"):
        assert key in out
    assert out["active_parameters"] < out["parameters"] / 4
    assert out["max_concurrent_sequences"] == int(
        out["kv_pool_bytes"] // out["kv_bytes_per_request"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["kv", "--model", "/no/such/config.json"], "no such file"),
        (["ceiling", "--params", "0"], "must be positive"),
        (["ceiling", "--params=-8e9"], "must be positive"),
        (["ceiling", "--params", "-8e9"], "expected one argument"),
        (["ceiling", "--params", "8e9", "--device", "h1OO sxm"], "did you mean h100-sxm"),
        (["ceiling", "--params", "8e9", "--device", "a100"], "a100-80gb-sxm"),
        (["ceiling", "--params", "8e9", "--dtype", "fp7"], "unknown dtype"),
        (["kv", "--params", "8e9"], "needs the model's shape"),
        (["ceiling"], "say which model"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(args: list[str], message: str) -> None:
    r = pdscope(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("pdscope: ") and message in lines[0]
    assert "Traceback" not in r.stderr


def test_json_that_is_not_a_config_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"hello": 1}')
    r = pdscope("kv", "--model", str(bad))
    assert r.returncode == 2 and "not a model config" in r.stderr
    cfg = json.loads((MODEL_CONFIGS / "meta-llama__Llama-3.1-8B.json").read_text())
    del cfg["num_key_value_heads"], cfg["hidden_size"]
    bad.write_text(json.dumps(cfg))
    r = pdscope("kv", "--model", str(bad))
    assert r.returncode == 2 and "missing hidden_size" in r.stderr


def test_a_context_beyond_the_models_maximum_warns_but_runs() -> None:
    cfg = str(MODEL_CONFIGS / "mistralai__Mistral-7B-v0.1.json")  # 32,768 positions
    r = pdscope("kv", "--model", cfg, "--context", "100000", "--json")
    assert r.returncode == 0
    assert "warning" in r.stderr and "beyond" in r.stderr
    assert json.loads(r.stdout)["context"] == 100000


def test_every_command_has_help_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    # In this process (a process a command cost 35 s on a busy 2-core machine); the command
    # line itself prints the same parser's help (one command run as a process below).
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    names = list(sub.choices)  # type: ignore[union-attr]
    assert {"ceiling", "kv", "devices"} <= set(names)
    for name in names:
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([name, "--help"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert "examples:" in out and f"pdscope {name}" in out.split("examples:")[1], name
    r = pdscope("bench", "--help")
    assert r.returncode == 0 and "--find-capacity" in r.stdout.split("examples:")[1]


def test_version_is_the_installed_distribution_s() -> None:
    r = pdscope("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"pdscope {metadata.version('pdscope')}\n"
    assert re.fullmatch(r"pdscope \d+\.\d+\.\d+\n", r.stdout)


def test_version_falls_back_to_the_package_s_own_when_pdscope_is_not_installed(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "version", not_installed)
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"pdscope {pdscope_package.__version__}\n"


def test_devices_json_lists_the_table_with_sources() -> None:
    r = pdscope("devices", "--json")
    rows = json.loads(r.stdout)["devices"]
    assert len(rows) >= 30
    assert all(row["source"] for row in rows)
