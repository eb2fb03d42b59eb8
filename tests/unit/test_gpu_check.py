"""tools/gpu_check.py's parts that need neither a GPU nor llama-server: the 8B shape, the GGUF it
writes (read back by pdscope's own reader), the padded tokenizer, the GPU names and
architectures, the source lookup and the table. The end-to-end run on a CPU is
tests/lab/test_gpu_check.py."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from pdscope.model import load_model

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", TOOLS / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gc = _load()

# Two layers, hidden 64: a GGUF of a few MB, written in well under a second.
SMALL = gc.Shape("small", "small", 2, 64, 4, 2, 16, 128, 49152, 500000.0, 2048)


def test_the_8b_shape_is_llama_3_8b() -> None:
    s = gc.LLAMA3_8B
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn, s.vocab) == (
        32, 4096, 32, 8, 128, 14336, 128256)
    # Meta-Llama-3-8B: 8.03 B parameters (8,030,261,248 with the untied output matrix).
    assert s.parameters == 8_030_261_248
    assert round(gc.gguf_size(s, "F16") / 1e9, 2) == 16.06
    # Q8_0: 34 bytes a block of 32; Q4_0: 18 (block scales included, as llama.cpp stores them).
    assert gc.gguf_size(s, "Q8_0") / gc.gguf_size(s, "F16") == pytest.approx(34 / 64, rel=1e-3)
    assert gc.gguf_size(s, "Q4_0") / gc.gguf_size(s, "F16") == pytest.approx(18 / 64, rel=1e-3)


@pytest.mark.model_file
@pytest.mark.parametrize("precision", ["F16", "Q8_0", "Q4_0"])
def test_the_gguf_has_the_shape_and_the_bytes(tmp_path: Path, gguf_path: Path,
                                              precision: str) -> None:
    path = tmp_path / f"small-{precision}.gguf"
    size = gc.write_gguf(path, SMALL, precision, gguf_path)
    geometry = load_model(path)
    assert geometry.num_layers == 2 and geometry.num_kv_heads == 2 and geometry.head_dim == 16
    assert geometry.parameters == SMALL.parameters
    assert geometry.weight_dtype == precision
    assert geometry.weight_bytes == gc.gguf_size(SMALL, precision)
    assert size > geometry.weight_bytes  # and the metadata (a tokenizer of 49,152 tokens)


@pytest.mark.model_file
def test_the_weights_are_small_and_finite_and_the_norms_one(tmp_path: Path,
                                                            gguf_path: Path) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "small-Q8_0.gguf"
    gc.write_gguf(path, SMALL, "Q8_0", gguf_path)
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    assert set(tensors) == {name for name, _ in SMALL.tensors()}
    q = gguf.quants.dequantize(np.asarray(tensors["blk.1.ffn_down.weight"].data),
                               gguf.GGMLQuantizationType.Q8_0)
    assert q.shape == (64, 128)
    assert np.isfinite(q).all() and 0.015 < float(q.std()) < 0.025
    assert (np.asarray(tensors["output_norm.weight"].data) == 1).all()


@pytest.mark.model_file
def test_the_tokenizer_is_padded_with_unique_normal_tokens(gguf_path: Path) -> None:
    keys = {k: v for k, v, _, _ in gc.padded_tokenizer(gguf_path, 128256)}
    tokens, types = keys["tokenizer.ggml.tokens"], keys["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 128256
    assert len(set(tokens)) == len(tokens)  # llama.cpp asserts unique token texts
    assert tokens[49152] == "<pad_49152>" and set(types[49152:]) == {1}  # NORMAL
    assert keys["tokenizer.ggml.model"] == "gpt2" and keys["tokenizer.ggml.pre"] == "smollm"
    assert len(keys["tokenizer.ggml.merges"]) == 48900  # copied as they are
    assert keys["tokenizer.ggml.eos_token_id"] == 2


@pytest.mark.model_file
def test_the_header_reader_agrees_with_gguf(gguf_path: Path) -> None:
    import gguf

    fields = gguf.GGUFReader(str(gguf_path)).fields
    for key, value, vtype, sub in gc.read_gguf_kv(gguf_path):
        assert fields[key].types[0] == vtype
        if sub is None:
            assert fields[key].contents() == pytest.approx(value)
        else:
            assert fields[key].types[1] == sub
            assert len(fields[key].contents()) == len(value)


def test_tiles_repeat_to_the_whole_tensor() -> None:
    for rows, row_bytes in ((128256, 4 * 4096), (14336, 4 * 4096), (4096, 4 * 14336), (7, 10)):
        t = gc._tile_rows(rows, row_bytes)
        assert rows % t == 0 and t * row_bytes <= max(gc.TILE_BYTES, row_bytes)
    tiled = gc._Tiled(b"abc", 4)

    class Sink:
        data = b""

        def write(self, b: memoryview) -> None:
            self.data += bytes(b)

    sink = Sink()
    tiled.tofile(sink)  # type: ignore[arg-type]
    assert sink.data == b"abc" * 4 and tiled.nbytes == 12


@pytest.mark.parametrize(("cap", "arch"), [("9.0", "90"), ("8.9", "89"), ("12.0", "120"),
                                           (" 10.0 ", "100")])
def test_compute_capability_to_cmake_architecture(cap: str, arch: str) -> None:
    assert gc.cuda_arch(cap) == arch


def test_a_malformed_compute_capability_is_an_error() -> None:
    with pytest.raises(gc.CheckError):
        gc.cuda_arch("sm_90")


@pytest.mark.parametrize(("name", "device"), [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"), ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("NVIDIA H200 NVL", "h200-nvl"),
])
def test_nvidia_smi_names_map_to_device_ids(name: str, device: str) -> None:
    assert gc.device_id(name) == device


def test_an_unknown_gpu_asks_for_device() -> None:
    with pytest.raises(gc.CheckError, match="--device"):
        gc.device_id("NVIDIA GeForce RTX 4080 SUPER")


def test_the_source_is_found_in_the_sdist(tmp_path: Path) -> None:
    tree = tmp_path / "pkg" / f"llama_cpp_python-{gc.LLAMA_CPP_VERSION}" / "vendor" / "llama.cpp"
    (tree / "tools" / "server").mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("project(x)\n")
    sdist = tmp_path / "dl" / gc.SDIST
    sdist.parent.mkdir()
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tmp_path / "pkg" / f"llama_cpp_python-{gc.LLAMA_CPP_VERSION}",
                arcname=f"llama_cpp_python-{gc.LLAMA_CPP_VERSION}")
    for given in (sdist, sdist.parent, tree, tree.parents[1]):
        found = gc.llama_source(given, tmp_path / f"out-{given.name}")
        assert (found / "CMakeLists.txt").is_file(), given


def test_no_source_says_how_to_fetch_it(tmp_path: Path) -> None:
    with pytest.raises(gc.CheckError, match=re.escape(
            "pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36")):
        gc.llama_source(tmp_path, tmp_path / "out")


def test_the_slot_context_holds_the_longest_request() -> None:
    for plan in (gc.GPU_PLAN, gc.TINY_PLAN):
        assert plan.slot_ctx % 256 == 0
        assert plan.slot_ctx >= plan.probe_long + max(plan.probe_max_tokens,
                                                      plan.context_max_tokens)
        assert max(plan.bench_users) <= plan.slots


def _result(precision: str, decode: float, ceiling: float) -> dict:
    probe = {"decode_tok_s": decode, "decode_ceiling_tok_s": ceiling,
             "decode_fraction_of_ceiling": decode / ceiling, "prefill_tok_s": 1000.0,
             "prefill_ceiling_tok_s": 5000.0, "prefill_fraction_of_ceiling": 0.2,
             "weight_bytes_read_per_token": 15e9}
    return {"precision": precision, "probe_200": probe, "probe_2000": probe,
            "context": {"slowdown": 0.05, "slowdown_predicted": 0.04},
            "bench": {"1": {"output_throughput": decode}, "8": {"output_throughput": 7 * decode},
                      "32": {"output_throughput": 20 * decode}},
            "bench_ceiling": {"32": 9000.0}}


def test_the_table_has_a_row_per_precision_and_the_references() -> None:
    refs = {"article": {"device": "NVIDIA H100 SXM", "decode_ceiling_tok_s": 209.375,
                        "prefill_ceiling_tok_s": 61812.5},
            "device": {"device": "NVIDIA H200 SXM", "decode_ceiling_tok_s": 300.0,
                       "prefill_ceiling_tok_s": 61812.5}}
    results = [_result("F16", 250.0, 300.0), _result("Q8_0", 450.0, 560.0),
               {"precision": "Q4_0", "skipped": "skipped: 400 s + ~60 s would pass"}]
    text = gc.table(results, refs, gc.GPU_PLAN)
    rows = gc.parse_table(text)
    assert list(rows)[:3] == ["F16", "Q8_0", "Q4_0"]
    assert rows["Q8_0"]["decode tok/s @200"] == "450.0"
    assert rows["Q8_0"]["decode vs F16 (ceiling)"] == "1.80× (1.87×)"
    assert rows["Q8_0"]["bench out tok/s, 1/8/32 users"] == "450/3,150/9,000"
    assert rows["Q4_0"]["decode vs F16 (ceiling)"].startswith("skipped")
    article = rows["article: 8B at 16 bits, NVIDIA H100 SXM"]
    assert article["decode ceiling @200"] == "209.4 (209 in the article's table)"
    assert gc.first_number(rows["roofline: 8B at 16 bits, NVIDIA H200 SXM"][
        "decode ceiling @200"]) == 300.0
    assert len({len(line.split("|")) for line in text.splitlines()}) == 1  # a well-formed table


def test_the_shell_entry_shows_the_flags() -> None:
    out = subprocess.run(["bash", str(TOOLS / "gpu_check.sh"), "--help"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    for flag in ("--cpu", "--tiny", "--server", "--source", "--out", "--budget"):
        assert flag in out


def test_progress_numbers_each_step_with_its_time() -> None:
    import io

    out = io.StringIO()
    progress = gc.Progress(9, out)
    with progress.step("probe 2000 tokens, F16"):
        progress.say("a note inside the step")
    progress.skip("Q4_0", "skipped: over the budget", 6)
    with pytest.raises(gc.CheckError), progress.step("start llama-server, Q8_0"):
        raise gc.CheckError("no")
    with progress.step("bench 1/8/32 users, F16"):
        pass
    lines = out.getvalue().splitlines()
    assert lines[0] == "[gpu-check] 1/9 probe 2000 tokens, F16 ..."
    assert lines[1] == "[gpu-check]   a note inside the step"
    assert re.fullmatch(r"\[gpu-check\] 1/9 probe 2000 tokens, F16: 0\.0 s \(t=0 s\)", lines[2])
    assert lines[3] == "[gpu-check] 2-7/9 Q4_0: skipped: over the budget"
    assert re.fullmatch(r"\[gpu-check\] 8/9 start llama-server, Q8_0 \.\.\. failed after 0\.0 s",
                        lines[4])
    assert re.fullmatch(r"\[gpu-check\] 9/9 bench 1/8/32 users, F16 \.\.\. 0\.0 s \(t=0 s\)",
                        lines[5])
    assert len(lines) == 6


@pytest.mark.model_file
def test_a_tokenizer_alone_is_the_same_tokenizer(tmp_path: Path, gguf_path: Path) -> None:
    small = tmp_path / "tok.gguf"
    assert gc.write_tokenizer(gguf_path, small) < 3_000_000
    assert gc.padded_tokenizer(small, 128256) == gc.padded_tokenizer(gguf_path, 128256)
