"""The native int8 GEMM: every code path this CPU runs against an int64 reference (shapes by hypothesis,
extreme values, zero points per tensor / row / column, threads), the float and requantizing epilogues,
the matmul_integer / qlinear_matmul kernels it registers into ops against ops' reference kernels, the
packed-weight cache, bad input, and the build modes (off, no compiler) in fresh interpreters."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _native import needs_native
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
import opstrata.quant as oq
from opstrata.ops.testing import TOLERANCES
from opstrata.quant import _kernels
from opstrata.quant.native import _library

pytestmark = [
    needs_native,
    pytest.mark.skipif(
        not hasattr(ops, "build_library"),
        reason="this opstrata-ops (<= 0.4.2, compatibility matrix) cannot build quant's library: numpy kernels only",
    ),
]
U8, S8 = np.dtype(np.uint8), np.dtype(np.int8)
RTOL, ATOL = TOLERANCES[np.dtype(np.float32)]


def _paths() -> list[Any]:
    have = set(_library.available_paths())
    return [
        pytest.param(
            p, marks=pytest.mark.skipif(p not in have, reason=f"this CPU lacks the {p} instructions")
        )
        for p in _library.PATHS
    ]


PATHS = _paths()


def ints(rng: np.random.Generator, shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, shape).astype(dt)


def ref_mm(a: np.ndarray, b: np.ndarray, za: Any = 0, zb: Any = 0) -> np.ndarray:
    """int64 reference of (a - za) @ (b - zb), za per tensor or per row, zb per tensor or per column,
    wrapped to int32 as ONNX's int32 result."""
    za = np.asarray(za, np.int64).reshape(-1, 1) if np.size(za) != 1 else np.int64(np.asarray(za).item())
    zb = np.asarray(zb, np.int64).reshape(-1)
    return ((a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)).astype(np.int32)


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    oq.reset_native_stats()


# --------------------------------------------------------------------------- exactness per path


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(0, 20),
    k=st.integers(0, 70),
    n=st.integers(0, 140),
    a_dt=st.sampled_from([U8, S8]),
    b_dt=st.sampled_from([S8, U8]),
    zp=st.sampled_from(["none", "tensor", "row_col"]),
    values=st.sampled_from(["random", "max", "min", "mixed"]),
    threads=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 2**16),
)
def test_exact_against_int64(
    path: str, m: int, k: int, n: int, a_dt: np.dtype, b_dt: np.dtype, zp: str, values: str, threads: int,
    seed: int,
) -> None:  # fmt: skip
    rng = np.random.default_rng(seed)
    a, b = ints(rng, (m, k), a_dt), ints(rng, (k, n), b_dt)
    ia, ib = np.iinfo(a_dt), np.iinfo(b_dt)
    if values == "max":
        a[:], b[:] = ia.max, ib.max
    elif values == "min":
        a[:], b[:] = ia.min, ib.min
    elif values == "mixed":  # the pairs that overflow int16 in vpmaddubsw
        a[:], b[:] = ia.max, ib.min
    za: Any = None
    zb: Any = None
    if zp == "tensor":
        za, zb = ints(rng, (), a_dt), ints(rng, (), b_dt)
    elif zp == "row_col":
        za, zb = ints(rng, (m,), a_dt), ints(rng, (n,), b_dt)
    got = oq.qgemm(a, oq.prepack_weight(b, zb), za, threads=threads, path=path)
    want = ref_mm(a, b, 0 if za is None else za, 0 if zb is None else zb)
    assert got.dtype == np.int32 and got.shape == (m, n)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (6, 4, 64), (7, 5, 65), (13, 1027, 129), (1, 768, 300)])
def test_exact_at_tile_edges_and_long_k(path: str, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * k * n)
    for a_dt, b_dt in [(U8, S8), (S8, S8), (U8, U8), (S8, U8)]:
        a, b = ints(rng, (m, k), a_dt), ints(rng, (k, n), b_dt)
        za, zb = ints(rng, (m,), a_dt), ints(rng, (n,), b_dt)
        np.testing.assert_array_equal(
            oq.qgemm(a, oq.prepack_weight(b, zb), za, path=path), ref_mm(a, b, za, zb)
        )


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("m", "k", "n"),
    [(32, 64, 32), (48, 65, 40), (70, 130, 100), (50, 1, 33), (95, 200, 64), (16, 63, 129), (33, 3, 1)],
)
def test_exact_at_amx_block_edges(path: str, m: int, k: int, n: int) -> None:
    """The AMX path's 32-row blocks (two 32-column halves of a panel), its 16-row block and the VNNI rows
    after them; K off the 64-byte tile row. Every path must agree on these shapes too."""
    rng = np.random.default_rng(m * 1000 + k + n)
    for a_dt, b_dt in [(U8, S8), (S8, U8)]:
        a, b = ints(rng, (m, k), a_dt), ints(rng, (k, n), b_dt)
        za, zb = ints(rng, (m,), a_dt), ints(rng, (n,), b_dt)
        np.testing.assert_array_equal(
            oq.qgemm(a, oq.prepack_weight(b, zb), za, path=path), ref_mm(a, b, za, zb)
        )


@pytest.mark.parametrize("path", PATHS)
def test_int32_wraps_like_onnx_when_the_sum_overflows(path: str) -> None:
    k = 70_000  # 255 * 127 * k > 2**31
    a, b = np.full((2, k), 255, np.uint8), np.full((k, 3), 127, np.int8)
    got = oq.qgemm(a, oq.prepack_weight(b), path=path)
    np.testing.assert_array_equal(got, ref_mm(a, b))  # int64 sum cast to int32 (modulo 2**32)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("m", "k", "n", "threads"),
    # rows split, panels split, uneven; the last big enough for threads on the AMX path (32M per thread)
    [(97, 512, 260, 3), (5, 1030, 2000, 2), (64, 1024, 200, 7), (200, 1030, 520, 3)],
)
def test_threads_split_rows_or_panels_exactly(path: str, m: int, k: int, n: int, threads: int) -> None:
    """Products big enough (>= 4M multiply-adds per thread, 32M on AMX) to really start threads."""
    rng = np.random.default_rng(m + n)
    a, b = ints(rng, (m, k), S8), ints(rng, (k, n), S8)
    za, zb = ints(rng, (m,), S8), ints(rng, (n,), S8)
    w = oq.prepack_weight(b, zb)
    np.testing.assert_array_equal(oq.qgemm(a, w, za, threads=threads, path=path), ref_mm(a, b, za, zb))


def test_every_available_path_gives_the_same_bits() -> None:
    rng = np.random.default_rng(7)
    a, b = ints(rng, (37, 300), U8), ints(rng, (300, 200), S8)
    w = oq.prepack_weight(b, np.int8(3))
    outs = {p: oq.qgemm(a, w, np.uint8(128), path=p) for p in _library.available_paths()}
    assert len(outs) >= 1
    for got in outs.values():
        np.testing.assert_array_equal(got, ref_mm(a, b, 128, 3))


def test_a_build_without_x86_code_runs_the_portable_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a non-x86 machine gets: the same source with the vector paths compiled out."""
    handle = ops.NativeLibrary(
        "opstrata_quant_qgemm_noarch", _library.SOURCE, _library._SIGNATURES,
        cflags=(*_library.LIBRARY.cflags, "-DQG_NO_X86"), abi=("opstrata_qgemm_abi", _library.ABI),
    )  # fmt: skip
    rng = np.random.default_rng(1)
    a, b = ints(rng, (9, 33), S8), ints(rng, (33, 70), U8)
    vector_fp = _kernels._fingerprint(b)
    monkeypatch.setattr(_library, "LIBRARY", handle)
    assert _library.available_paths() == ["portable"] and oq.native_status().best_path == "portable"
    assert _kernels._fingerprint(b) == vector_fp  # the generic build hashes alike
    np.testing.assert_array_equal(
        oq.qgemm(a, oq.prepack_weight(b, np.uint8(7)), np.int8(-3)), ref_mm(a, b, -3, 7)
    )
    with pytest.raises(oq.QuantError, match="it runs portable"):
        oq.qgemm(a, oq.prepack_weight(b), path="avx2")


def test_status_names_paths_and_counts_calls() -> None:
    s = oq.native_status(build=True)
    assert s.available is True and s.reason == "" and "portable" in s.paths
    assert s.best_path in s.paths and (s.best_path != "portable" or s.paths == ["portable"])
    assert Path(s.library or "").is_file()
    assert "-march=native" not in _library.LIBRARY.cflags  # runs on any CPU of the architecture
    oq.qgemm(np.ones((2, 3), np.uint8), oq.prepack_weight(np.ones((3, 4), np.int8)))
    assert oq.native_status().calls["qgemm"] == {"native": 1, "numpy": 0}


# --------------------------------------------------------------------------- epilogues


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(0, 17),
    k=st.integers(1, 90),
    n=st.integers(1, 100),
    per_row=st.booleans(),
    per_col=st.booleans(),
    with_bias=st.booleans(),
    relu=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_float_epilogue_matches_float64(
    path: str, m: int, k: int, n: int, per_row: bool, per_col: bool, with_bias: bool, relu: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    a, b = ints(rng, (m, k), U8), ints(rng, (k, n), S8)
    za = ints(rng, (), U8)
    sa = (rng.uniform(1e-3, 0.1, m) if per_row else rng.uniform(1e-3, 0.1, ())).astype(np.float32)
    sb = (rng.uniform(1e-3, 0.1, n) if per_col else rng.uniform(1e-3, 0.1, ())).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    w = oq.prepack_weight(b, scale=sb)
    got = oq.qgemm(a, w, za, a_scale=sa, bias=bias, relu=relu, path=path)
    acc = ref_mm(a, b, za).astype(np.float64)
    want = acc * (sa.astype(np.float64).reshape(-1, 1) if per_row else float(sa)) * sb.astype(np.float64)
    if bias is not None:
        want = want + bias
    if relu:
        want = np.maximum(want, 0.0)
    assert got.dtype == np.float32 and got.shape == (m, n)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("a_dt", "y_dt"), [(U8, U8), (S8, S8), (U8, S8)])
def test_requantize_epilogue_matches_ops_qlinear_matmul_bit_for_bit(
    path: str, a_dt: np.dtype, y_dt: np.dtype
) -> None:
    rng = np.random.default_rng(3)
    a, b = ints(rng, (19, 77), a_dt), ints(rng, (77, 70), S8)
    sa, sb, sy = np.float32(0.02), rng.uniform(0.001, 0.01, 70).astype(np.float32), np.float32(0.05)
    za, zb, zy = ints(rng, (), a_dt), np.int8(0), ints(rng, (), y_dt)
    got = oq.qgemm(
        a, oq.prepack_weight(b, zb), za, a_scale=sa, b_scale=sb, y_scale=sy, y_zero_point=zy, path=path
    )
    want = ops.qlinear_matmul(a, sa, za, b, sb, zb, sy, zy, device="ref")
    assert got.dtype == y_dt
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- registered into ops


def test_import_registers_cpu_kernels_above_ops_own() -> None:
    for op in ("matmul_integer", "qlinear_matmul"):
        cpu = [e for e in ops.kernels(op) if e.device == "cpu"]
        assert cpu[0].fn is _kernels._KERNELS[op][0] and cpu[0].priority == _kernels.KERNEL_PRIORITY
        assert len(cpu) >= 2  # ops' numpy kernel is still there, below
        for dt in (U8, S8):
            assert ops.resolve_kernel(op, dt, device="cpu") is cpu[0].fn
            assert ops.dispatch_path(op, "cpu", dt) == "native"
        assert ops.resolve_kernel(op, U8, device="ref") is not cpu[0].fn  # ref keeps ops' reference


def test_uninstall_gives_ops_kernels_back_and_install_restores() -> None:
    try:
        _kernels.uninstall()
        assert all(e.fn is not _kernels._KERNELS["matmul_integer"][0] for e in ops.kernels("matmul_integer"))
        a, b = np.ones((2, 3), np.uint8), np.ones((3, 2), np.int8)
        assert ops.matmul_integer(a, b).tolist() == [[3, 3], [3, 3]]
        assert "matmul_integer" not in oq.native_status().calls
    finally:
        every = ["matmul_integer", "qlinear_matmul", "dynamic_quantize_linear", "dynamic_qmatmul", "qconv",
                 "qconv_quantize", "qmatmul", "quantize_linear", "dequant_matmul"]  # fmt: skip
        # qmatmul: ops >= 0.4.57; qconv_quantize: ops >= 0.4.64
        assert _kernels.install() == [op for op in every if op in ops.list_ops()]
    assert ops.resolve_kernel("matmul_integer", U8, device="cpu") is _kernels._matmul_integer_native
    _kernels.install()  # idempotent: no second entry
    assert sum(e.fn is _kernels._matmul_integer_native for e in ops.kernels("matmul_integer")) == 1


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "zp"),
    [
        ((5, 7), (7, 9), "none"),
        ((5, 7), (7, 9), "tensor"),
        ((5, 7), (7, 9), "row_col"),
        ((3, 4, 33), (33, 70), "tensor"),
        ((2, 6, 10), (10, 3), "row_col"),  # per-row a zero point broadcast over the batch
        ((33,), (33, 5), "tensor"),  # 1-D a
        ((0, 8), (8, 4), "tensor"),
        ((4, 0), (0, 4), "none"),
    ],
)
@pytest.mark.parametrize(("a_dt", "b_dt"), [(U8, S8), (S8, S8), (U8, U8)])
def test_matmul_integer_native_equals_ops_ref(
    a_shape: tuple[int, ...], b_shape: tuple[int, int], zp: str, a_dt: np.dtype, b_dt: np.dtype
) -> None:
    rng = np.random.default_rng(11)
    a, b = ints(rng, a_shape, a_dt), ints(rng, b_shape, b_dt)
    args: tuple[Any, ...] = (a, b)
    if zp == "tensor":
        args += (ints(rng, (), a_dt), ints(rng, (), b_dt))
    elif zp == "row_col":
        args += (ints(rng, (a_shape[-2],), a_dt), ints(rng, (b_shape[1],), b_dt))
    got = ops.matmul_integer(*args)
    want = ops.matmul_integer(*args, device="ref")
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert oq.native_status().calls["matmul_integer"]["native"] == 1


def test_matmul_integer_hands_batched_b_to_ops_numpy_kernel() -> None:
    rng = np.random.default_rng(2)
    a, b = ints(rng, (2, 3, 4), U8), ints(rng, (2, 4, 5), S8)
    np.testing.assert_array_equal(ops.matmul_integer(a, b), ops.matmul_integer(a, b, device="ref"))
    assert oq.native_status().calls["matmul_integer"] == {"native": 0, "numpy": 1}


def test_matmul_integer_errors_still_come_from_ops() -> None:
    a, b = np.ones((2, 3), np.uint8), np.ones((3, 4), np.int8)
    with pytest.raises(ops.OpError, match="a_zero_point"):
        ops.matmul_integer(a, b, np.int8(1))  # zero point of the wrong dtype
    with pytest.raises(ValueError):
        ops.matmul_integer(a, np.ones((4, 4), np.int8))  # K mismatch: numpy's matmul message


@pytest.mark.parametrize(("a_dt", "y_zp"), [(U8, np.uint8(9)), (S8, np.int8(-3)), (U8, None), (S8, None)])
@pytest.mark.parametrize("per_col", [False, True])
def test_qlinear_matmul_native_equals_ops_ref(a_dt: np.dtype, y_zp: Any, per_col: bool) -> None:
    rng = np.random.default_rng(5)
    a, b = ints(rng, (2, 9, 40), a_dt), ints(rng, (40, 67), S8)
    sb = rng.uniform(0.001, 0.02, 67).astype(np.float32) if per_col else np.float32(0.01)
    zb = ints(rng, (67,), S8) if per_col else np.int8(1)
    args = (a, np.float32(0.03), ints(rng, (), a_dt), b, sb, zb, np.float32(0.07), y_zp)
    got, want = ops.qlinear_matmul(*args), ops.qlinear_matmul(*args, device="ref")
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert oq.native_status().calls["qlinear_matmul"]["native"] == 1


def test_qlinear_matmul_per_row_a_scale_goes_to_numpy() -> None:
    rng = np.random.default_rng(6)
    a, b = ints(rng, (4, 8), U8), ints(rng, (8, 3), S8)
    args = (
        a,
        np.full(4, 0.02, np.float32),
        np.uint8(3),
        b,
        np.float32(0.01),
        np.int8(0),
        np.float32(0.1),
        np.uint8(0),
    )
    np.testing.assert_array_equal(ops.qlinear_matmul(*args), ops.qlinear_matmul(*args, device="ref"))
    assert oq.native_status().calls["qlinear_matmul"] == {"native": 0, "numpy": 1}


def test_read_only_weights_are_packed_once_and_dropped_with_the_array() -> None:
    rng = np.random.default_rng(8)
    a, b = ints(rng, (3, 16), U8), ints(rng, (16, 8), S8)
    b.flags.writeable = False
    before = _kernels.packed_cache_size()
    first = ops.matmul_integer(a, b)
    w = _kernels._pack(b, None)
    ops.matmul_integer(a, b)
    assert _kernels._pack(b, None) is w and _kernels.packed_cache_size() == before + 1
    np.testing.assert_array_equal(first, ref_mm(a, b))
    assert _kernels._pack(b, np.int8(2)) is not w  # another zero point: packed again
    del b, w
    gc.collect()
    assert _kernels.packed_cache_size() == before


def test_writeable_weights_are_reused_while_unchanged_and_repacked_when_changed() -> None:
    rng = np.random.default_rng(12)
    a, b = ints(rng, (2, 40), U8), ints(rng, (40, 70), S8)
    np.testing.assert_array_equal(ops.matmul_integer(a, b), ref_mm(a, b))
    w = _kernels._pack(b, None)
    assert _kernels._pack(b, None) is w  # unchanged content: the packing is reused
    b[39, 69] ^= 1  # one bit of the last byte
    assert _kernels._pack(b, None) is not w
    np.testing.assert_array_equal(ops.matmul_integer(a, b), ref_mm(a, b))
    b[:] = 2
    assert ops.matmul_integer(np.ones((2, 40), np.uint8), b).tolist() == [[80] * 70] * 2


def test_a_read_only_view_of_a_writeable_array_is_not_trusted() -> None:
    rng = np.random.default_rng(14)
    a, base = ints(rng, (3, 20), U8), ints(rng, (20, 30), S8)
    view = base[:, :]
    view.flags.writeable = False
    np.testing.assert_array_equal(ops.matmul_integer(a, view), ref_mm(a, view))
    base[0, 0] ^= 1  # changes what the read-only view shows
    np.testing.assert_array_equal(ops.matmul_integer(a, view), ref_mm(a, view))
    frozen = np.frombuffer(base.tobytes(), np.int8).reshape(20, 30)  # read-only over immutable bytes
    assert _kernels._immutable(frozen) and not _kernels._immutable(view)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(0, 40), n=st.integers(0, 80), seed=st.integers(0, 2**16))
def test_fingerprint_sees_any_single_byte_change(k: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = ints(rng, (k, n), S8)
    before = _kernels._fingerprint(b)
    assert _kernels._fingerprint(b.copy()) == before and _kernels._fingerprint(np.asfortranarray(b)) == before
    if b.size:
        i, j = rng.integers(0, k), rng.integers(0, n)
        b[i, j] = np.int8(b[i, j] ^ np.int8(1 << int(rng.integers(0, 7))))
        assert _kernels._fingerprint(b) != before


def test_concurrent_callers_share_a_packed_weight() -> None:
    """ctypes drops the GIL: runtime stream workers may call the kernel at once on one weight."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(15)
    b = ints(rng, (300, 130), S8)
    b.flags.writeable = False
    inputs = [ints(rng, (33, 300), U8) for _ in range(8)]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda a: ops.matmul_integer(a, b), inputs))
    for a, got in zip(inputs, outs, strict=True):
        np.testing.assert_array_equal(got, ref_mm(a, b))
    assert _kernels.packed_cache_size() >= 1


def test_qgemm_threads_setting() -> None:
    assert oq.get_qgemm_threads() == 1
    oq.set_qgemm_threads(2)
    try:
        rng = np.random.default_rng(9)
        a, b = ints(rng, (64, 600), U8), ints(rng, (600, 260), S8)  # 10M multiply-adds: 2 threads run
        np.testing.assert_array_equal(ops.matmul_integer(a, b), ref_mm(a, b))
    finally:
        oq.set_qgemm_threads(1)
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        oq.set_qgemm_threads(0)


# --------------------------------------------------------------------------- bad input


def test_out_receives_the_result_in_place() -> None:
    rng = np.random.default_rng(13)
    a, b = ints(rng, (2, 5, 30), U8), ints(rng, (30, 70), S8)
    w = oq.prepack_weight(b)
    out = np.full((2, 5, 70), -1, np.int32)
    assert oq.qgemm(a, w, out=out) is out
    np.testing.assert_array_equal(out, ref_mm(a.reshape(10, 30), b).reshape(2, 5, 70))
    wide = np.zeros((10, 100), np.float32)  # a view with a row stride wider than N
    got = oq.qgemm(a.reshape(10, 30), w, a_scale=0.5, b_scale=0.25, out=wide[:, 10:80])
    np.testing.assert_array_equal(got, ref_mm(a.reshape(10, 30), b) * np.float32(0.125))
    assert not wide[:, :10].any() and not wide[:, 80:].any()
    with pytest.raises(oq.QuantError, match="out must be a writeable int32 array of shape"):
        oq.qgemm(a, w, out=np.empty((2, 5, 70), np.float32))
    with pytest.raises(oq.QuantError, match="unit-stride"):
        oq.qgemm(a.reshape(10, 30), w, out=np.empty((10, 140), np.int32)[:, ::2])


def test_non_contiguous_inputs_are_handled() -> None:
    rng = np.random.default_rng(4)
    big_a, big_b = ints(rng, (10, 40), U8), ints(rng, (30, 50), S8)
    a, b = big_a[::2, ::2], big_b[::, ::3][:20]  # strided rows and columns
    np.testing.assert_array_equal(oq.qgemm(a, oq.prepack_weight(b)), ref_mm(a, b))
    fa = np.asfortranarray(ints(rng, (7, 20), U8))
    np.testing.assert_array_equal(oq.qgemm(fa, oq.prepack_weight(b)), ref_mm(fa, b))
    np.testing.assert_array_equal(ops.matmul_integer(a, b.T.copy().T), ref_mm(a, b))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda w: oq.qgemm(np.ones((2, 4), np.float32), w), "a must be int8 or uint8, got float32"),
        (lambda w: oq.qgemm(np.ones((2, 5), np.uint8), w), "last dim must equal the weight's K=4"),
        (lambda w: oq.qgemm(np.ones((2, 4), np.uint8), np.ones((4, 3), np.int8)), "must be a PackedWeight"),
        (lambda w: oq.qgemm(np.ones((2, 4), np.uint8), w, np.array([1, 2, 3])), "one value per row of a"),
        (lambda w: oq.qgemm(np.ones((2, 4), np.uint8), w, 300), r"must lie in \[0, 255\]"),
        (lambda w: oq.qgemm(np.ones((2, 4), np.uint8), w, 1.5), "must be integer"),
        (lambda w: oq.qgemm(np.ones((2, 4), np.uint8), w, threads=0), "threads must be an int >= 1"),
        (lambda w: oq.qgemm(np.ones((2, 4), np.uint8), w, path="sse9"), "path='sse9' is not one of"),
        (lambda w: oq.qgemm(np.ones((2, 4), np.uint8), w, a_scale=0.1), "needs b_scale"),
        (lambda w: oq.qgemm(np.ones((2, 4), np.uint8), w, bias=np.ones(3, np.float32)), "float32 epilogue"),
        (lambda w: oq.qgemm(np.ones((2, 4), np.uint8), w, a_scale=0.1, b_scale=np.ones(2)), "per column"),
        (
            lambda w: oq.qgemm(np.ones((2, 4), np.uint8), w, a_scale=1.0, b_scale=1.0, y_scale=0.0),
            "not finite",
        ),
        (lambda w: oq.prepack_weight(np.ones((2, 3, 4), np.int8)), "b must be 2-D"),
        (lambda w: oq.prepack_weight(np.ones((4, 3), np.int16)), "b must be int8 or uint8, got int16"),
        (lambda w: oq.prepack_weight(np.ones((4, 3), np.int8), np.zeros(2, np.int8)), "one value per column"),
    ],
)
def test_bad_input_names_the_argument(call: Any, match: str) -> None:
    w = oq.prepack_weight(np.ones((4, 3), np.int8))
    with pytest.raises(oq.QuantError, match=match):
        call(w)


def test_a_path_the_cpu_lacks_is_refused_naming_the_ones_it_has() -> None:
    missing = [p for p in _library.PATHS if p not in _library.available_paths()]
    if not missing:
        pytest.skip("this CPU runs every path")
    with pytest.raises(oq.QuantError, match="needs CPU features this machine lacks"):
        oq.qgemm(np.ones((1, 4), np.uint8), oq.prepack_weight(np.ones((4, 1), np.int8)), path=missing[0])


def test_packed_weight_is_read_only() -> None:
    w = oq.prepack_weight(np.ones((4, 3), np.int8), np.int8(1), scale=0.5)
    assert w.shape == (4, 3) and not w.data.flags.writeable and not w.colsum.flags.writeable
    with pytest.raises(ValueError):
        w.data[0] = 1
    with pytest.raises(
        oq.QuantError, match="do not fit a packed"
    ):  # hand-made: refused, never read out of bounds
        oq.PackedWeight(np.zeros(3, np.int8), w.colsum, w.zbe, 4, 3, w.dtype, w.zero_point)


# --------------------------------------------------------------------------- build modes (fresh interpreters)

_PROBE = """
    import json, warnings
    import numpy as np
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import opstrata.quant as oq, opstrata.ops as ops
        a, b = np.arange(12, dtype=np.uint8).reshape(3, 4), np.ones((4, 2), np.int8)
        got = ops.matmul_integer(a, b).tolist()
    s = oq.native_status()
    try:
        oq.prepack_weight(b)
        err = ""
    except oq.NativeUnavailableError as e:
        err = str(e)
    print(json.dumps({"available": s.available, "reason": s.reason, "calls": s.calls, "got": got, "err": err,
                      "warnings": [m.category.__name__ for m in caught]}))
"""


def run_probe(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "OPSTRATA_CACHE_DIR": str(tmp_path / "cache"), **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PROBE)], capture_output=True, text=True, env=full, timeout=300
    )


def _json(got: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout.strip().splitlines()[-1])


WANT = [[6, 6], [22, 22], [38, 38]]


def test_off_mode_leaves_ops_numpy_kernels_and_says_why(tmp_path: Path) -> None:
    res = _json(run_probe(tmp_path, OPSTRATA_NATIVE="off"))
    assert res["got"] == WANT and res["available"] is False and "OPSTRATA_NATIVE=off" in res["reason"]
    assert res["calls"]["matmul_integer"] == {"native": 0, "numpy": 1}
    assert "unavailable" in res["err"] and "OPSTRATA_NATIVE=off" in res["err"]


def test_no_compiler_auto_warns_once_and_runs_numpy(tmp_path: Path) -> None:
    res = _json(run_probe(tmp_path, CC="/nonexistent/cc", OPSTRATA_NATIVE="auto"))
    assert res["got"] == WANT and res["available"] is False and "cannot run" in res["reason"]
    assert res["calls"]["matmul_integer"] == {"native": 0, "numpy": 1}
    assert res["warnings"].count("NativeBuildWarning") >= 1


def test_no_compiler_on_mode_is_an_error_not_a_silent_fallback(tmp_path: Path) -> None:
    got = run_probe(tmp_path, CC="/nonexistent/cc", OPSTRATA_NATIVE="on")
    assert got.returncode != 0
    assert (
        "NativeBuildError" in got.stderr
        and "quant int8 kernels" in got.stderr
        and "/nonexistent/cc" in got.stderr
    )


def test_fresh_build_in_an_empty_cache_is_native(tmp_path: Path) -> None:
    res = _json(run_probe(tmp_path, OPSTRATA_NATIVE="on"))
    assert res["got"] == WANT and res["available"] is True and res["calls"]["matmul_integer"]["native"] == 1
    built = list((tmp_path / "cache" / "native").glob("opstrata_quant_qgemm-*.so"))
    assert len(built) == 1 and not list((tmp_path / "cache" / "native").glob("*.tmp"))


# --------------------------------------------------------------------------- dynamic quantization


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 700), scale=st.floats(1e-3, 1e3), shift=st.floats(-2, 2), ties=st.booleans(),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_dynamic_quantize_native_is_bit_identical_to_ops_ref(n, scale, shift, ties, seed) -> None:
    """Ranges all-positive, all-negative, straddling zero, constant; values on rounding ties; any length."""
    x = ((np.random.default_rng(seed).standard_normal(n) + shift) * scale).astype(np.float32)
    if ties:
        x = (np.round(x * 2) / 2).astype(np.float32)
    oq.reset_native_stats()
    got = ops.dynamic_quantize_linear(x)
    want = ops.dynamic_quantize_linear(x, device="ref")
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    assert oq.native_status().calls["dynamic_quantize_linear"] == {"native": 1, "numpy": 0}


@settings(max_examples=30, deadline=None)
@given(scale=st.floats(1e-3, 1e3), shift=st.floats(-1, 1), seed=st.integers(0, 2**16))
def test_dynamic_quantize_is_exact_next_to_rounding_ties(scale: float, shift: float, seed: int) -> None:
    """The AVX-512 path multiplies by 1 / scale and divides only lanes near a half-integer: values whose
    quotient x / scale lies on a tie or a few ulps either side of one still give the reference's bytes."""
    rng = np.random.default_rng(seed)
    base = ((rng.standard_normal(64) + shift) * scale).astype(np.float32)
    hi, lo = np.float32(max(base.max(), 0)), np.float32(min(base.min(), 0))
    s = np.float32((hi - lo) / np.float32(255))
    t = rng.integers(int(np.ceil(lo / s)) + 1, max(int(np.floor(hi / s)) - 1, int(np.ceil(lo / s)) + 2), 600)
    x = ((t + 0.5) * s).astype(np.float32)
    for _ in range(3):  # up to three ulps either way off the tie
        x = np.where(rng.random(x.size) < 0.5, np.nextafter(x, np.float32(np.inf)), x)
        x = np.where(rng.random(x.size) < 0.3, np.nextafter(x, np.float32(-np.inf)), x).astype(np.float32)
    x = np.clip(x, lo, hi).astype(np.float32)
    frac = np.abs((x / s) % 1 - 0.5)
    assert (frac < 2.0**-12).mean() > 0.5  # most quotients sit next to a tie
    x = np.concatenate([base, x])
    got = ops.dynamic_quantize_linear(x)
    want = ops.dynamic_quantize_linear(x, device="ref")
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and np.array_equal(g, w)


def test_dynamic_quantize_with_nan_is_left_to_ops_kernel() -> None:
    x = np.array([1.0, np.nan, -2.0], np.float32)
    oq.reset_native_stats()
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = ops.dynamic_quantize_linear(x)
        want = ops.dynamic_quantize_linear(x, device="ref")
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert oq.native_status().calls["dynamic_quantize_linear"] == {"native": 0, "numpy": 1}


@settings(max_examples=25, deadline=None)
@given(
    lead=st.lists(st.integers(1, 6), min_size=0, max_size=2), k=st.integers(1, 80), n=st.integers(1, 40),
    b_dt=st.sampled_from([U8, S8]), per_col=st.booleans(), with_zp=st.booleans(), with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_dynamic_qmatmul_native_equals_ops_ref(lead, k, n, b_dt, per_col, with_zp, with_bias, seed) -> None:
    r = np.random.default_rng(seed)
    x = (r.standard_normal((*lead, k)) * 4).astype(np.float32)
    info = np.iinfo(b_dt)
    b = r.integers(info.min, info.max + 1, (k, n)).astype(b_dt)
    sc = r.uniform(1e-3, 1e-1, n if per_col else ()).astype(np.float32)
    zp = r.integers(info.min, info.max + 1, n if per_col else ()).astype(b_dt) if with_zp else None
    bias = r.standard_normal(n).astype(np.float32) if with_bias else None
    oq.reset_native_stats()
    got = ops.dynamic_qmatmul(x, b, sc, zp, bias)
    want = ops.dynamic_qmatmul(x, b, sc, zp, bias, device="ref")
    assert got.shape == want.shape == (*lead, n) and got.dtype == np.float32
    # the int32 product and x's quantization are exact; only the float epilogue may round differently
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(want).max())))
    assert oq.native_status().calls["dynamic_qmatmul"] == {"native": 1, "numpy": 0}


def test_dynamic_qmatmul_hands_what_it_does_not_cover_to_ops() -> None:
    x = np.ones((2, 3), np.float32)
    b = np.ones((3, 2), np.int8)
    oq.reset_native_stats()
    got = ops.dynamic_qmatmul(x, b, np.float32(0.5), np.ones(2, np.uint8).astype(np.int8) * 0, None)
    assert got.tolist() == ops.dynamic_qmatmul(x, b, np.float32(0.5), device="ref").tolist()
    x_nan = np.array([[1.0, np.nan, 0.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ops.dynamic_qmatmul(x_nan, b, np.float32(0.5))
    assert oq.native_status().calls["dynamic_qmatmul"] == {"native": 1, "numpy": 1}


def test_onnxruntime_quantize_dynamic_model_runs_fused_and_native(tmp_path) -> None:
    """A model quantized by onnxruntime's own quantize_dynamic: every MatMulInteger chain becomes one
    native DynamicQMatMul in the session, and the outputs agree with onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    quantization = pytest.importorskip("onnxruntime.quantization")
    import onnx
    from _quant_models import mlp

    from opstrata.runtime import InferenceSession

    onnx.save(mlp(), tmp_path / "f.onnx")
    quantization.quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"),
                                  weight_type=quantization.QuantType.QInt8)  # fmt: skip
    x = (np.random.default_rng(0).standard_normal((8, 64)) * 2).astype(np.float32)
    sess = InferenceSession(str(tmp_path / "q.onnx"))
    assert sess.plan.graph.op_counts().get("ai.opstrata::DynamicQMatMul", 0) == 3
    oq.reset_native_stats()
    ours = sess.run(None, {"x": x})[0]
    assert oq.native_status().calls["dynamic_qmatmul"] == {"native": 3, "numpy": 0}
    theirs = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * float(np.abs(theirs).max()))


def test_registered_kernels_use_the_sessions_threads(monkeypatch) -> None:
    """Inside ops.intra_op_threads (an InferenceSession's run) the int8 kernels take its count; outside,
    set_qgemm_threads' setting."""
    seen: list[int] = []
    real = _kernels.qgemm

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["threads"])
        return real(*args, **kwargs)

    real_dynamic = _kernels.dynamic_qgemm

    def spy_dynamic(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["threads"])
        return real_dynamic(*args, **kwargs)

    monkeypatch.setattr(_kernels, "qgemm", spy)
    monkeypatch.setattr(_kernels, "dynamic_qgemm", spy_dynamic)
    a, b = np.ones((4, 8), np.uint8), np.ones((8, 3), np.int8)
    x = np.ones((4, 8), np.float32)
    ops.matmul_integer(a, b)
    with ops.intra_op_threads(3):
        ops.matmul_integer(a, b)
        ops.dynamic_qmatmul(x, b, np.float32(1))
    oq.set_qgemm_threads(2)
    try:
        ops.matmul_integer(a, b)
    finally:
        oq.set_qgemm_threads(1)
    assert seen == [1, 3, 3, 2]


def _dql_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ops' reference DynamicQuantizeLinear applied to each row of a 2-D x (per-token quantization)."""
    rows = [ops.dynamic_quantize_linear(r, device="ref") for r in x]
    return (np.stack([q for q, _, _ in rows]), np.array([s for _, s, _ in rows], np.float32),
            np.array([z for _, _, z in rows], np.uint8))  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 20), k=st.integers(1, 70), n=st.integers(1, 140), per_row=st.sampled_from([False, True, "sym"]),
    b_dt=st.sampled_from([U8, S8]), with_bias=st.booleans(), relu=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_dynamic_qgemm_equals_reference_on_every_path(m, k, n, per_row, b_dt, with_bias, relu, seed) -> None:
    """One C call = DynamicQuantizeLinear (per tensor or per row) + exact int32 product + float epilogue:
    the quantized values, scales and zero points bit-identical to ops' reference, the floats within
    rounding, on every path this CPU runs."""
    r = np.random.default_rng(seed)
    x = (r.standard_normal((m, k)) * r.uniform(0.1, 8.0, (m, 1))).astype(np.float32)
    info = np.iinfo(b_dt)
    b = r.integers(info.min, info.max + 1, (k, n)).astype(b_dt)
    zp = np.asarray(r.integers(info.min, info.max + 1), b_dt)
    sb = r.uniform(1e-3, 1e-1, n).astype(np.float32)
    bias = r.standard_normal(n).astype(np.float32) if with_bias else None
    if per_row == "sym":  # per-token symmetric int8: held as uint8 + 128
        qs, s = ops.token_quantize(x)
        q, s, z = qs.astype(np.int16) + 128, s.reshape(-1), np.full(m, 128, np.uint8)
    elif per_row:
        q, s, z = _dql_rows(x)
    else:
        q0, s0, z0 = ops.dynamic_quantize_linear(x, device="ref")
        q, s, z = q0, np.array([s0], np.float32), np.array([z0], np.uint8)
    acc = (q.astype(np.int64) - z.astype(np.int64).reshape(-1, 1)) @ (b.astype(np.int64) - int(zp))
    want = acc.astype(np.float32) * (s.reshape(-1, 1) * sb)
    if bias is not None:
        want = want + bias
    if relu:
        want = np.maximum(want, 0)
    packed = oq.prepack_weight(b, zp)
    for path in oq.native_status().paths:
        got = oq.dynamic_qgemm(
            x, packed, sb, bias, per_row=bool(per_row), symmetric=per_row == "sym", relu=relu, path=path
        )
        assert got is not None
        y, gs, gz = got
        assert np.array_equal(gs, s) and np.array_equal(gz, z), path
        np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(want).max())))


def test_dynamic_qgemm_nan_writes_nothing_and_out_is_filled_in_place() -> None:
    b = oq.prepack_weight(np.ones((3, 2), np.int8))
    sb = np.full(2, 0.5, np.float32)
    out = np.full((2, 2), 7.0, np.float32)
    x_nan = np.array([[1.0, np.nan, 0.0], [1.0, 2.0, 3.0]], np.float32)
    assert oq.dynamic_qgemm(x_nan, b, sb, out=out) is None
    assert (out == 7.0).all()
    x = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32)
    y, _, _ = oq.dynamic_qgemm(x, b, sb, out=out)
    assert y is out
    np.testing.assert_allclose(
        out, ops.dynamic_qmatmul(x, np.ones((3, 2), np.int8), sb, device="ref"), rtol=1e-6
    )
    with pytest.raises(oq.QuantError, match="b_scale must be a contiguous float32"):
        oq.dynamic_qgemm(x, b, sb.astype(np.float64))
    with pytest.raises(oq.QuantError, match="x must be float32"):
        oq.dynamic_qgemm(x[:, :2], b, sb)


def test_dynamic_qmatmul_writes_into_out() -> None:
    """ops.dynamic_qmatmul(..., out=) on the native kernel and on ops' own: the same values, in out."""
    r = np.random.default_rng(3)
    x = r.standard_normal((2, 5, 16)).astype(np.float32)
    b = r.integers(-127, 128, (16, 8)).astype(np.int8)
    sc, bias = np.float32(0.02), r.standard_normal(8).astype(np.float32)
    want = ops.dynamic_qmatmul(x, b, sc, None, bias, device="ref")
    for device in ("cpu", "ref"):
        out = np.empty((2, 5, 8), np.float32)
        assert ops.dynamic_qmatmul(x, b, sc, None, bias, out=out, device=device) is out
        np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL * float(np.abs(want).max()))
    with pytest.raises(ops.OpError, match="out"):
        ops.dynamic_qmatmul(x, b, sc, out=np.empty((2, 5, 7), np.float32))
    with pytest.raises(ops.OpError, match="overlapping x"):
        ops.dynamic_qmatmul(x, b, sc, out=x[..., :8])
