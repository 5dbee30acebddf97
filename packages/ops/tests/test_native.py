"""Native kernels: the C library's GELU / bias+GELU / layer norm against float64 references (shapes by
hypothesis, IEEE specials, in place), what is handed to numpy, the numpy kernels they replace, and the
build's failure modes (no compiler, a failing compiler, a corrupted cached library, a bad mode)."""

from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops.kernels.activation import gelu_cpu
from opstrata.ops.kernels.fused import bias_act_cpu
from opstrata.ops.kernels.normalization import layer_norm_cpu
from opstrata.ops.native import library as _native
from opstrata.ops.testing import TOLERANCES, assert_close

pytestmark = pytest.mark.skipif(
    shutil.which((os.environ.get("CC") or "cc").split()[0]) is None, reason="no C compiler on this machine"
)
RTOL, ATOL = TOLERANCES[np.dtype(np.float32)]
_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu_tanh64(h: np.ndarray) -> np.ndarray:
    """Tanh-form GELU computed in float64, rounded to float32."""
    h = h.astype(np.float64)
    return (0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h * h * h)))).astype(
        np.float32
    )


def softmax64(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64 (fully -inf rows give zeros), rounded to float32."""
    x = x.astype(np.float64)
    mx = x.max(axis=-1, keepdims=True)
    mx[~np.isfinite(mx)] = 0.0
    e = np.exp(x - mx)
    tot = e.sum(axis=-1, keepdims=True)
    return np.divide(e, tot, out=np.zeros_like(e), where=tot > 0).astype(np.float32)


def gelu64(h: np.ndarray) -> np.ndarray:
    """Exact GELU computed in float64, rounded to float32 (the kernels' dtype)."""
    h = h.astype(np.float64)
    return (h * 0.5 * (1.0 + _erf(h / math.sqrt(2.0)))).astype(np.float32)


def layer_norm64(x: np.ndarray, w: Any, b: Any, eps: float, axis: int = -1) -> np.ndarray:
    """Layer norm computed in float64, rounded to float32."""
    x = x.astype(np.float64)
    dims = tuple(range(axis % x.ndim, x.ndim))
    mu = x.mean(axis=dims, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=dims, keepdims=True) + eps)
    return (y * (1 if w is None else w) + (0 if b is None else b)).astype(np.float32)


def rnd(shape: tuple[int, ...], seed: int, scale: float = 2.0, shift: float = 0.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale + shift).astype(np.float32)


@pytest.fixture(autouse=True)
def native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from the default mode with zeroed call counts."""
    monkeypatch.delenv(_native.ENV_MODE, raising=False)
    ops.reset_native_stats()


def calls(op: str) -> dict[str, int]:
    return ops.native_status().calls.get(op, {"native": 0, "numpy": 0})


# --------------------------------------------------------------------------- the library


def test_library_builds_loads_and_reports_itself() -> None:
    out = ops.gelu(rnd((4, 33), 0))
    st_ = ops.native_status()
    assert st_.mode == "auto" and st_.available is True and st_.reason == ""
    assert st_.library is not None and Path(st_.library).is_file()
    assert Path(st_.library).parent == ops.native_cache_dir()
    assert st_.calls["gelu"] == {"native": 1, "numpy": 0}
    assert out.dtype == np.float32 and out.shape == (4, 33)
    leftovers = [p.name for p in ops.native_cache_dir().iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


# --------------------------------------------------------------------------- gelu / bias_act


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 70), min_size=1, max_size=3).map(tuple),
    scale=st.sampled_from([0.1, 2.0, 6.0]),
    seed=st.integers(0, 2**16),
)
def test_gelu_native_matches_float64(shape: tuple[int, ...], scale: float, seed: int) -> None:
    x = rnd(shape, seed, scale)
    got = ops.gelu(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert_close(got, gelu64(x), rtol=RTOL, atol=ATOL)
    assert calls("gelu")["native"] >= 1


def test_gelu_native_ieee_specials() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 12.0, -12.0, 1e30, -1e30, 3.9, -3.9], np.float32)
    got = ops.gelu(x)
    assert np.isnan(got[0]) and got[1] == np.inf and np.isnan(got[2])  # -inf * 0: as numpy's x * Phi(x)
    np.testing.assert_array_equal(got[3:5], [0.0, 0.0])
    assert got[5] == np.float32(12.0) and got[6] == 0.0
    assert got[7] == np.float32(1e30) and got[8] == 0.0
    assert_close(got[9:], gelu64(x[9:]), rtol=RTOL, atol=ATOL)
    assert calls("gelu") == {"native": 1, "numpy": 0}


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 90),
    bias_shape=st.sampled_from(["none", "row", "2d"]),
    where=st.sampled_from(["fresh", "out", "in_place"]),
    seed=st.integers(0, 2**16),
)
def test_bias_gelu_native_matches_float64(
    rows: int, cols: int, bias_shape: str, where: str, seed: int
) -> None:
    x = rnd((rows, cols), seed)
    bias = None if bias_shape == "none" else rnd((cols,) if bias_shape == "row" else (1, cols), seed + 1)
    expected = gelu64(x + (0 if bias is None else bias))
    before = calls("bias_act")["native"]
    if where == "fresh":
        got = ops.bias_act(x, bias, act="gelu")
    elif where == "out":
        out = np.full_like(x, np.nan)
        got = ops.bias_act(x, bias, act="gelu", out=out)
        assert got is out
    else:  # the GEMM epilogue: out is x itself
        got = ops.call("bias_act", x, bias, act="gelu", out=x)
        assert got is x
    assert_close(got, expected, rtol=RTOL, atol=ATOL)
    assert calls("bias_act")["native"] == before + 1


@pytest.mark.parametrize("act", ["relu", "silu"])
@pytest.mark.parametrize("in_place", [False, True])
def test_bias_relu_silu_native_match_float64(act: str, in_place: bool) -> None:
    x, b = rnd((33, 77), 30, 4.0), rnd((77,), 31)
    x[0, :6] = [np.nan, np.inf, -np.inf, -0.0, 100.0, -100.0]
    h = (x + b).astype(np.float64)
    with np.errstate(all="ignore"):
        want = (np.maximum(h, 0.0) if act == "relu" else h / (1.0 + np.exp(-h))).astype(np.float32)
    got = ops.call("bias_act", x, b, act=act, out=x if in_place else None)
    assert_close(got, want, rtol=RTOL, atol=ATOL)  # NaN matches NaN (numpy testing convention)
    assert np.isnan(got[0, 0]) and got[0, 1] == np.inf  # NaN kept; silu(inf) = inf
    assert got[0, 2] == 0.0 or np.isnan(got[0, 2])  # relu(-inf) = 0; silu(-inf) = -inf / inf: NaN
    assert calls("bias_act") == {"native": 1, "numpy": 0}


def test_bias_gelu_native_agrees_with_gelu_of_the_sum() -> None:
    x, b = rnd((37, 129), 3), rnd((129,), 4)
    np.testing.assert_array_equal(ops.bias_act(x, b, act="gelu"), ops.gelu(x + b))


@pytest.mark.parametrize(
    "case",
    ["residual", "strided", "broadcast_bias", "float64"],
)
def test_cases_outside_the_c_loop_run_on_numpy_correctly(case: str) -> None:
    x, b = rnd((6, 16), 5), rnd((16,), 6)
    act, residual, out, expect_numpy = "gelu", None, None, True  # out: None throughout
    if case == "residual":
        residual = rnd((6, 16), 7)
    elif case == "strided":
        x = rnd((6, 32), 5)[:, ::2]
    elif case == "broadcast_bias":
        b = rnd((6, 1), 6)
    elif case == "float64":
        x, b, expect_numpy = x.astype(np.float64), b.astype(np.float64), False  # never reaches native
    expected = ops.bias_act(x, b, residual, act=act, device="ref")
    got = ops.call("bias_act", x, b, residual, act=act, out=out)
    assert_close(got, expected, rtol=RTOL, atol=ATOL)
    assert calls("bias_act") == {"native": 0, "numpy": 1 if expect_numpy else 0}


def test_out_the_c_loop_cannot_write_gets_a_copy_of_the_native_result() -> None:
    x, b = rnd((6, 16), 20), rnd((16,), 21)
    strided = np.full((6, 32), np.nan, np.float32)[:, ::2]
    assert ops.bias_act(x, b, act="gelu", out=strided) is strided
    np.testing.assert_array_equal(strided, ops.bias_act(x, b, act="gelu"))
    big = rnd((7, 16), 22)
    want = ops.layer_norm(big[:6].copy())
    got = ops.call("layer_norm", big[:6], out=big[1:])  # partial overlap: computed whole, then copied
    np.testing.assert_array_equal(got, want)
    assert calls("bias_act") == {"native": 2, "numpy": 0} and calls("layer_norm") == {"native": 2, "numpy": 0}


def test_out_the_c_loop_cannot_write_is_refused() -> None:
    from opstrata.ops.native.kernels import _writable_out

    big = rnd((7, 16), 5)
    x = big[:6]
    assert _writable_out(None, x) and _writable_out(x, x) and _writable_out(np.empty_like(x), x)
    assert not _writable_out(big[1:], x)  # partial overlap: the row loop would read what it wrote
    assert not _writable_out(np.empty((6, 16), np.float64), x)
    assert not _writable_out(np.empty((16, 6), np.float32).T, x)
    ro = np.empty_like(x)
    ro.flags.writeable = False
    assert not _writable_out(ro, x)


def test_low_precision_stays_on_numpy() -> None:
    x = rnd((5, 9), 8)
    g = ops.gelu(x.astype(ops.bfloat16))
    p = ops.softmax(x.astype(ops.float16))
    assert g.dtype == ops.bfloat16 and p.dtype == ops.float16
    assert ops.native_status().calls == {}  # the registry sends them straight to the numpy kernels


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 30),
    cols=st.integers(1, 90),
    scale=st.sampled_from([0.5, 3.0, 30.0]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gelu_tanh_native_matches_float64(
    rows: int, cols: int, scale: float, with_bias: bool, seed: int
) -> None:
    x = rnd((rows, cols), seed, scale)
    b = rnd((cols,), seed + 1) if with_bias else None
    before = calls("bias_act")["native"]
    got = ops.bias_act(x, b, act="gelu_tanh")
    assert_close(got, gelu_tanh64(x + (0 if b is None else b)), rtol=RTOL, atol=ATOL)
    assert calls("bias_act")["native"] == before + 1
    if b is None:  # the op and the epilogue run the same C loop: identical bits
        np.testing.assert_array_equal(ops.gelu(x, approximate="tanh"), got)


def test_gelu_tanh_native_specials() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 60.0, -60.0, 1e30, -1e30], np.float32)
    got = ops.gelu(x, approximate="tanh")
    assert np.isnan(got[0]) and got[1] == np.inf and np.isnan(got[2])
    np.testing.assert_array_equal(got[3:], [0.0, 60.0, 0.0, np.float32(1e30), 0.0])


# --------------------------------------------------------------------------- softmax and attention


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple),
    scale=st.sampled_from([0.1, 5.0, 80.0]),
    masked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_softmax_native_matches_float64(
    shape: tuple[int, ...], scale: float, masked: bool, seed: int
) -> None:
    x = rnd(shape, seed, scale)
    if masked:  # some -inf entries, and one row masked entirely
        x[np.random.default_rng(seed).random(shape) < 0.3] = -np.inf
        x.reshape(-1, shape[-1])[0] = -np.inf
    before = calls("softmax")["native"]
    got = ops.softmax(x)
    assert_close(got, softmax64(x), rtol=RTOL, atol=ATOL)
    assert calls("softmax")["native"] == before + 1


def test_softmax_native_specials_and_other_axes() -> None:
    x = np.array(
        [[0.0, np.nan, 1.0], [np.inf, 0.0, 1.0], [-np.inf, -np.inf, 5.0], [-1e30, 0.0, 1e30]], np.float32
    )
    got = ops.softmax(x)
    assert np.isnan(got[0]).all() and np.isnan(got[1, 0])  # a NaN poisons its row; inf - inf is NaN
    np.testing.assert_array_equal(got[2], [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(got[3], [0.0, 0.0, 1.0])
    y = rnd((3, 4, 5), 15)
    assert_close(ops.softmax(y, axis=1), ops.softmax(y, axis=1, device="ref"), rtol=RTOL, atol=ATOL)
    assert calls("softmax") == {"native": 1, "numpy": 1}  # axis=1 is not the last: numpy


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [None, "bool", "float"])
def test_attention_single_tile_softmax_runs_native(causal: bool, mask: str | None) -> None:
    rng = np.random.default_rng(16)
    q, k, v = (rng.standard_normal((2, 4, 48, 16)).astype(np.float32) for _ in range(3))
    m: Any = None
    if mask == "bool":
        m = rng.random((2, 1, 48, 48)) < 0.8
        m[0, 0, 3] = False  # a row with every key masked: zeros, as the reference
    elif mask == "float":
        m = np.where(rng.random((2, 1, 1, 48)) < 0.8, 0.0, -np.inf).astype(np.float32)
    got = ops.attention(q, k, v, mask=m, causal=causal)
    want = ops.attention(q, k, v, mask=m, causal=causal, device="ref").astype(np.float32)
    assert_close(got, want, rtol=RTOL, atol=ATOL)
    assert calls("attention") == {"native": 1, "numpy": 0}


# --------------------------------------------------------------------------- layer_norm


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 33),
    n=st.integers(1, 300),
    affine=st.sampled_from(["both", "weight", "bias", "none"]),
    shift=st.sampled_from([0.0, 1e4]),
    in_place=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_layer_norm_native_matches_float64(
    rows: int, n: int, affine: str, shift: float, in_place: bool, seed: int
) -> None:
    x = rnd((rows, n), seed, 3.0, shift)
    w = rnd((n,), seed + 1) if affine in ("both", "weight") else None
    b = rnd((n,), seed + 2) if affine in ("both", "bias") else None
    expected = layer_norm64(x, w, b, 1e-5)
    before = calls("layer_norm")
    got = ops.call("layer_norm", x, w, b, eps=1e-5, out=x if in_place else None)
    if in_place:
        assert got is x
    # a shift of 1e4 leaves ~1e-3 of float32 resolution in x itself: the reference sees the rounded x too
    assert_close(got, expected, rtol=RTOL * 4, atol=ATOL * (40 if shift else 4))
    assert calls("layer_norm") == {"native": before["native"] + 1, "numpy": before["numpy"]}


def test_layer_norm_native_trailing_dims_constant_rows_and_eps() -> None:
    x = rnd((3, 4, 5, 6), 9)
    w, b = rnd((5, 6), 10), rnd((5, 6), 11)
    assert_close(ops.layer_norm(x, w, b, axis=-2), layer_norm64(x, w, b, 1e-5, axis=-2), rtol=RTOL, atol=ATOL)
    const = np.full((2, 40), 7.0, np.float32)
    np.testing.assert_array_equal(
        ops.layer_norm(const, None, np.ones(40, np.float32), eps=0.5), np.ones((2, 40))
    )
    got = ops.layer_norm(rnd((2, 50), 12), eps=10.0)
    assert_close(got, layer_norm64(rnd((2, 50), 12), None, None, 10.0), rtol=RTOL, atol=ATOL)
    assert calls("layer_norm") == {"native": 3, "numpy": 0}


def test_layer_norm_nan_row_stays_in_its_row() -> None:
    x = rnd((3, 20), 13)
    x[1, 4] = np.nan
    got = ops.layer_norm(x)
    assert np.isnan(got[1]).all() and np.isfinite(got[[0, 2]]).all()
    assert_close(got[[0, 2]], layer_norm64(x[[0, 2]], None, None, 1e-5), rtol=RTOL, atol=ATOL)


def test_layer_norm_outside_the_c_loop_runs_on_numpy() -> None:
    x = rnd((4, 24), 14)[:, ::2]
    assert_close(ops.layer_norm(x), layer_norm64(x, None, None, 1e-5), rtol=RTOL, atol=ATOL)
    assert calls("layer_norm") == {"native": 0, "numpy": 1}


# --------------------------------------------------------------------------- the numpy kernels kept


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 20), cols=st.integers(1, 80), seed=st.integers(0, 2**16))
def test_numpy_kernels_still_match_float64(rows: int, cols: int, seed: int) -> None:
    """The numpy float32 paths (run when the library is off or cannot take a case) stay correct."""
    x, b, w = rnd((rows, cols), seed), rnd((cols,), seed + 1), rnd((cols,), seed + 2)
    assert_close(gelu_cpu(x), gelu64(x), rtol=RTOL, atol=ATOL)
    assert_close(bias_act_cpu(x, b, act="gelu"), gelu64(x + b), rtol=RTOL, atol=ATOL)
    assert_close(layer_norm_cpu(x, w, b), layer_norm64(x, w, b, 1e-5), rtol=RTOL * 4, atol=ATOL * 4)


# --------------------------------------------------------------------------- modes and build failures


def run_py(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (the library state is per process) with a private cache."""
    full = {**os.environ, "OPSTRATA_CACHE_DIR": str(tmp_path / "cache"), **env}
    if "OPSTRATA_NATIVE" not in env:
        full.pop("OPSTRATA_NATIVE", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full, timeout=300
    )


_PROBE = """
    import json, warnings
    import numpy as np
    import opstrata.ops as ops
    x = np.linspace(-5, 5, 64, dtype=np.float32)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        y = ops.gelu(x)
        ops.gelu(x)
    s = ops.native_status()
    ref = ops.gelu(x, device="ref")
    print(json.dumps({"available": s.available, "mode": s.mode, "reason": s.reason, "calls": s.calls,
                      "warnings": [str(m.category.__name__) for m in w], "err": float(np.abs(y - ref).max())}))
"""


def probe(tmp_path: Path, **env: str) -> dict[str, Any]:
    got = run_py(_PROBE, tmp_path, **env)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout.strip().splitlines()[-1])


def test_no_compiler_auto_warns_once_and_runs_numpy(tmp_path: Path) -> None:
    res = probe(tmp_path, CC="/nonexistent/cc")
    assert res["available"] is False and res["mode"] == "auto"
    assert "cannot run" in res["reason"] and "OPSTRATA_NATIVE=off" in res["reason"]
    assert res["warnings"] == ["NativeBuildWarning"]  # once, not per call
    assert res["calls"]["gelu"] == {"native": 0, "numpy": 2} and res["err"] < 1e-5


def test_no_compiler_on_mode_is_an_error(tmp_path: Path) -> None:
    got = run_py(_PROBE, tmp_path, CC="/nonexistent/cc", OPSTRATA_NATIVE="on")
    assert got.returncode != 0
    assert (
        "NativeBuildError" in got.stderr
        and "/nonexistent/cc" in got.stderr
        and "apt-get install gcc" in got.stderr
    )


def test_failing_compiler_names_the_command_and_leaves_no_temp_file(tmp_path: Path) -> None:
    got = run_py(_PROBE, tmp_path, CC="false", OPSTRATA_NATIVE="on")
    assert got.returncode != 0 and "failed (exit 1)" in got.stderr and "false -O3" in got.stderr
    native_dir = tmp_path / "cache" / "native"
    assert not native_dir.exists() or list(native_dir.iterdir()) == []


def test_off_mode_runs_numpy_and_says_so(tmp_path: Path) -> None:
    res = probe(tmp_path, OPSTRATA_NATIVE="off")
    assert res["available"] is False and "OPSTRATA_NATIVE=off" in res["reason"]
    assert res["calls"]["gelu"] == {"native": 0, "numpy": 2} and res["warnings"] == []


def test_unknown_mode_is_an_error_naming_the_variable(tmp_path: Path) -> None:
    got = run_py(_PROBE, tmp_path, OPSTRATA_NATIVE="fast")
    assert got.returncode != 0 and "OPSTRATA_NATIVE='fast'" in got.stderr and "auto, on, off" in got.stderr


def test_corrupted_cached_library_is_rebuilt(tmp_path: Path) -> None:
    code = """
        from opstrata.ops.native import library as _native
        p = _native.library_path()
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"not a shared library")
        print(p)
    """
    got = run_py(code, tmp_path)
    assert got.returncode == 0, got.stderr
    path = Path(got.stdout.strip())
    res = probe(tmp_path, OPSTRATA_NATIVE="on")
    assert res["available"] is True and res["calls"]["gelu"]["native"] == 2 and res["err"] < 1e-5
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x7fELF"


def test_status_with_build_reports_a_failed_on_mode_build_instead_of_raising(tmp_path: Path) -> None:
    code = """
        import json
        import opstrata.ops as ops
        s = ops.native_status(build=True)
        print(json.dumps({"available": s.available, "reason": s.reason}))
    """
    got = run_py(code, tmp_path, CC="false", OPSTRATA_NATIVE="on")
    assert got.returncode == 0, got.stderr
    res = json.loads(got.stdout.strip().splitlines()[-1])
    assert res["available"] is False and "failed (exit 1)" in res["reason"]
    ok = run_py(code, tmp_path)
    assert json.loads(ok.stdout.strip().splitlines()[-1]) == {"available": True, "reason": ""}


# --------------------------------------------------------------------------- the shared build machinery


_TINY_C = "int tiny_abi(void) { return 7; }\nint tiny_add(int a, int b) { return a + b; }\n"
_TINY_SIGS = {"tiny_add": ([ctypes.c_int, ctypes.c_int], ctypes.c_int)}


def test_build_library_compiles_once_caches_and_sets_signatures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPSTRATA_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "tiny.c"
    src.write_text(_TINY_C)
    lib, path = ops.build_library("tiny", src, _TINY_SIGS, abi=("tiny_abi", 7))
    assert (
        lib.tiny_add(2, 40) == 42 and path.parent == ops.native_cache_dir() and path.name.startswith("tiny-")
    )
    mtime = path.stat().st_mtime_ns
    _, again = ops.build_library("tiny", src, _TINY_SIGS, abi=("tiny_abi", 7))
    assert again == path and path.stat().st_mtime_ns == mtime  # reused, not rebuilt
    src.write_text(_TINY_C + "int tiny_sub(int a, int b) { return a - b; }\n")
    _, changed = ops.build_library("tiny", src, _TINY_SIGS, abi=("tiny_abi", 7))
    assert changed != path  # the source is part of the key
    assert not list(ops.native_cache_dir().glob("*.tmp"))


def test_build_library_rebuilds_an_abi_mismatch_and_reports_a_bad_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPSTRATA_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "tiny.c"
    src.write_text(_TINY_C)
    with pytest.raises(ops.NativeBuildError, match="cannot load it"):
        ops.build_library("tiny", src, _TINY_SIGS, abi=("tiny_abi", 8))
    bad = tmp_path / "bad.c"
    bad.write_text("int broken( {\n")
    with pytest.raises(
        ops.NativeBuildError, match=r"(?s)mylib: .*bad\.c.*failed \(exit 1\).*OPSTRATA_NATIVE=off"
    ):
        ops.build_library("bad", bad, {}, what="mylib")
    assert not list((tmp_path / "cache" / "native").glob("*.tmp"))


def test_native_library_handle_honours_the_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSTRATA_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "tiny.c"
    src.write_text(_TINY_C)
    monkeypatch.setenv(_native.ENV_MODE, "off")
    handle = ops.NativeLibrary("tiny", src, _TINY_SIGS)
    assert handle.get() is None and handle.status().available is False
    assert "OPSTRATA_NATIVE=off" in handle.status().reason
    monkeypatch.setenv(_native.ENV_MODE, "auto")
    assert handle.status().available is None  # not tried yet
    lib = handle.get()
    assert lib is not None and lib.tiny_add(1, 2) == 3 and handle.status().available is True
    broken = ops.NativeLibrary("bad", tmp_path / "missing.c", {}, what="mylib")
    with pytest.warns(ops.NativeBuildWarning, match="mylib: cannot read"):
        assert broken.get() is None
    assert broken.get() is None and "cannot read" in broken.status().reason  # warned once, remembered
    monkeypatch.setenv(_native.ENV_MODE, "on")
    with pytest.raises(ops.NativeBuildError, match="mylib"):
        ops.NativeLibrary("bad", tmp_path / "missing.c", {}, what="mylib").get()


def test_portable_builds_do_not_key_on_cpu_flags_but_march_native_does() -> None:
    from opstrata.ops.native import build

    assert "-march=native" not in build.PORTABLE_CFLAGS
    assert "-march=native" in _native.CFLAGS and _native.LIBRARY.cflags == _native.CFLAGS


# ---------------------------------------------------------------- depthwise convolution


def depthwise64(x: np.ndarray, w: np.ndarray, b: Any, stride: tuple, pads: tuple, dil: tuple) -> np.ndarray:
    """Depthwise conv2d by its definition, taps summed in float64, rounded to float32."""
    n, c = x.shape[:2]
    kh, kw = w.shape[2:]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    ho = (xp.shape[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (xp.shape[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, c, ho, wo)) + (0.0 if b is None else b.astype(np.float64)[None, :, None, None])
    for i in range(kh):
        for j in range(kw):
            r, s = i * dil[0], j * dil[1]
            patch = xp[
                :,
                :,
                r : r + stride[0] * (ho - 1) + 1 : stride[0],
                s : s + stride[1] * (wo - 1) + 1 : stride[1],
            ]
            out += patch * w[:, 0, i, j].astype(np.float64)[None, :, None, None]
    return out.astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.integers(2, 19),
    h=st.integers(1, 13),
    wd=st.integers(1, 21),
    k=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    dil=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pads=st.tuples(*[st.integers(0, 3)] * 4),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_depthwise_conv_native_matches_float64(n, c, h, wd, k, stride, dil, pads, with_bias, seed) -> None:
    """groups == C_in == C_out runs the C loop (any kernel, stride, dilation, padding; 3x3/5x5 unrolled;
    planes narrower than a vector with 8+ channels: channels in lanes, a partial last block)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    w = rng.standard_normal((c, 1, *k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32) if with_bias else None
    if (h + pads[0] + pads[2] - dil[0] * (k[0] - 1) - 1) < 0 or (
        wd + pads[1] + pads[3] - dil[1] * (k[1] - 1) - 1
    ) < 0:
        return  # no output position: conv2d refuses it (tested in test_conv.py)
    ops.reset_native_stats()
    got = ops.conv2d(x, w, b, stride=stride, padding=pads, dilation=dil, groups=c)
    assert ops.native_status().calls["conv2d"] == {"native": 1, "numpy": 0}
    assert_close(got, depthwise64(x, w, b, stride, pads, dil), rtol=RTOL, atol=ATOL)


def test_convs_beside_depthwise_run_im2col_in_c_and_strided_input_on_numpy() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    ops.reset_native_stats()
    for w, groups in (
        (rng.standard_normal((8, 1, 3, 3)), 4),  # a channel multiplier of 2
        (rng.standard_normal((4, 2, 3, 3)), 2),  # grouped, not depthwise
        (rng.standard_normal((4, 4, 3, 3)), 1),  # dense
    ):
        w = w.astype(np.float32)
        got = ops.conv2d(x, w, groups=groups, padding=1)
        assert_close(got, ops.conv2d(x, w, groups=groups, padding=1, device="ref"), rtol=RTOL, atol=ATOL)
    strided = x[:, :, :, ::2]  # not C-contiguous: numpy
    dw = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    assert_close(
        ops.conv2d(strided, dw, groups=4),
        ops.conv2d(strided, dw, groups=4, device="ref"),
        rtol=RTOL,
        atol=ATOL,
    )
    assert ops.native_status().calls["conv2d"] == {"native": 3, "numpy": 1}


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 2), cg=st.integers(1, 4), og=st.integers(1, 3), groups=st.sampled_from([1, 2, 3]),
    h=st.integers(3, 10), w=st.integers(3, 10), k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3)), dil=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pads=st.tuples(*(st.integers(0, 2) for _ in range(4))), seed=st.integers(0, 999),
)  # fmt: skip
def test_im2col_in_c_matches_the_numpy_and_ref_kernels(
    n, cg, og, groups, h, w, k, stride, dil, pads, seed
) -> None:
    """Columns made in C (padding, stride, dilation, groups in one pass) feed the GEMM numpy's
    sliding-window copy feeds: the numpy and ref kernels' values within float32 tolerance (the bound call's
    bits are the eager call's: test_bind)."""
    from opstrata.ops.kernels.conv import conv2d_cpu

    rng = np.random.default_rng(seed)
    if any(
        d * (kk - 1) + 1 > s + p0 + p1
        for d, kk, s, p0, p1 in zip(dil, k, (h, w), pads[:2], pads[2:], strict=True)
    ):
        return  # no output position
    x = rng.standard_normal((n, cg * groups, h, w)).astype(np.float32)
    wt = rng.standard_normal((og * groups, cg, *k)).astype(np.float32)
    b = rng.standard_normal(og * groups).astype(np.float32)
    kw = {"stride": stride, "padding": pads, "dilation": dil, "groups": groups}
    ops.reset_native_stats()
    got = ops.conv2d(x, wt, b, **kw)
    depthwise = cg == 1 and og == 1 and groups > 1
    assert_close(got, conv2d_cpu(x, wt, b, **kw), rtol=RTOL, atol=ATOL)  # numpy's GEMM order follows layout
    assert_close(got, ops.conv2d(x, wt, b, device="ref", **kw), rtol=RTOL, atol=ATOL)
    plain = k == (1, 1) and stride == (1, 1) and not any(pads)
    if not plain or depthwise:
        assert ops.native_status().calls["conv2d"] == {"native": 1, "numpy": 0}


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9),
    k=st.tuples(st.integers(1, 3), st.integers(1, 3)), stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    dil=st.tuples(st.integers(1, 2), st.integers(1, 2)), pads=st.tuples(*(st.integers(0, 1) for _ in range(4))),
    ceil=st.booleans(), nan=st.booleans(), seed=st.integers(0, 999),
)  # fmt: skip
def test_max_pool_native_matches_the_numpy_and_ref_kernels(
    n, c, h, w, k, stride, dil, pads, ceil, nan, seed
) -> None:
    from opstrata.ops.kernels.pool import max_pool2d_cpu

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    if nan:
        x.flat[rng.integers(x.size)] = np.nan
    kw = {"kernel_size": k, "stride": stride, "padding": pads, "dilation": dil, "ceil_mode": ceil}
    try:
        want = max_pool2d_cpu(x, **kw)
    except ops.OpError:
        with pytest.raises(ops.OpError):
            ops.max_pool2d(x, **kw)
        return
    ops.reset_native_stats()
    got = ops.max_pool2d(x, **kw)
    assert ops.native_status().calls["max_pool2d"] == {"native": 1, "numpy": 0}
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, ops.max_pool2d(x, device="ref", **kw))


def test_max_pool_outside_the_c_loop_runs_on_numpy() -> None:
    x = np.random.default_rng(0).standard_normal((1, 2, 8, 8))
    ops.reset_native_stats()
    for arr in (x, x.astype(np.float32)[:, :, :, ::2]):  # float64; a strided view
        np.testing.assert_array_equal(
            ops.max_pool2d(arr, kernel_size=2), ops.max_pool2d(arr, kernel_size=2, device="ref")
        )
    assert ops.native_status().calls["max_pool2d"] == {"native": 0, "numpy": 1}


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 12), w=st.integers(1, 12),
    k=st.tuples(st.integers(1, 3), st.integers(1, 3)), stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    pads=st.tuples(*(st.integers(0, 1) for _ in range(4))), ceil=st.booleans(), cip=st.booleans(),
    nan=st.booleans(), seed=st.integers(0, 999),
)  # fmt: skip
def test_avg_pool_native_gives_the_numpy_kernels_bits(
    n, c, h, w, k, stride, pads, ceil, cip, nan, seed
) -> None:
    """Windows inside the image run in the C loop with the numpy kernel's bits (taps summed in its order,
    one division); padded or ceil-mode windows, whose divisors vary, stay on the numpy kernel."""
    from opstrata.ops.kernels.pool import avg_pool2d_cpu

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    if nan:
        x.flat[rng.integers(x.size)] = np.nan
    kw = {"kernel_size": k, "stride": stride, "padding": pads, "ceil_mode": ceil, "count_include_pad": cip}
    try:
        want = avg_pool2d_cpu(x, **kw)
    except ops.OpError:
        with pytest.raises(ops.OpError):
            ops.avg_pool2d(x, **kw)
        return
    ops.reset_native_stats()
    got = ops.avg_pool2d(x, **kw)
    inside = not any(pads) and want.shape[2:] == ((h - k[0]) // stride[0] + 1, (w - k[1]) // stride[1] + 1)
    assert ops.native_status().calls["avg_pool2d"] == {"native": int(inside), "numpy": int(not inside)}
    np.testing.assert_array_equal(got, want)
    assert_close(got, ops.avg_pool2d(x, device="ref", **kw), rtol=1e-6, atol=1e-6)
    out = np.full_like(got, np.nan)
    bound = ops.bind("avg_pool2d", x, out=out, **kw)
    assert (bound is not None) == inside  # the C call with its pointers resolved, or the per-call path
    if bound is not None:
        bound()
        np.testing.assert_array_equal(out, want)


def test_avg_pool_outside_the_c_loop_runs_on_numpy() -> None:
    x = np.random.default_rng(0).standard_normal((1, 2, 8, 8))
    ops.reset_native_stats()
    for arr in (x, x.astype(np.float32)[:, :, :, ::2]):  # float64; a strided view
        np.testing.assert_array_equal(
            ops.avg_pool2d(arr, kernel_size=2), ops.avg_pool2d(arr, kernel_size=2, device="ref")
        )
    assert ops.native_status().calls["avg_pool2d"] == {"native": 0, "numpy": 1}
    assert (
        ops.bind("avg_pool2d", x.astype(np.float32), out=np.empty((1, 2, 3, 3), np.float32), kernel_size=2)
        is None
    )


def test_tanh_gelu_keeps_relative_accuracy_in_the_left_tail() -> None:
    """The native tanh GELU is h * sigmoid(2u): no cancellation in 1 + tanh(u) where h < 0, so the small
    outputs of the left tail keep their relative accuracy (the float32 cubic in u bounds it)."""
    x = np.linspace(-9.0, -2.0, 20001).astype(np.float32)
    got = ops.gelu(x, approximate="tanh").astype(np.float64)
    x64 = x.astype(np.float64)
    want = x64 / (1.0 + np.exp(-2.0 * np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64**3)))
    ulps = np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert ulps.max() < 512, ulps.max()
    assert np.all(np.sign(got) == -1.0)
