"""assert_close and compare: per-dtype defaults, torch-shaped messages, metrics against plain references.

References are plain numpy/Python in float64 (np.isclose on upcast arrays, loops for the metrics);
torch.testing.assert_close is the pass/fail peer where torch is importable.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from opstrata.eval import DEFAULT_TOLERANCES, Metrics, assert_close, compare, default_tolerances
from opstrata.eval._ulp import ulp_distance

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
FLOATS = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _ref_close(a: np.ndarray, b: np.ndarray, rtol: float, atol: float, equal_nan: bool) -> np.ndarray:
    """np.isclose in float64 (numpy alone would compute in the inputs' dtype)."""
    return np.isclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol, equal_nan=equal_nan)


def _passes(a: np.ndarray, b: np.ndarray, **kw: object) -> bool:
    try:
        assert_close(a, b, **kw)  # type: ignore[arg-type]
    except AssertionError:
        return False
    return True


# ---------------------------------------------------------------- default tolerances


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (np.float32, (1.3e-6, 1e-5)), (np.float16, (1e-3, 1e-5)), (BF16, (1.6e-2, 1e-5)),
        (np.float64, (1e-7, 1e-7)), (np.complex64, (1.3e-6, 1e-5)), (np.complex128, (1e-7, 1e-7)),
        (np.int8, (0.0, 0.0)), (np.uint64, (0.0, 0.0)), (np.bool_, (0.0, 0.0)),
        (E4M3, (0.125, 2.0**-9)), (E5M2, (0.25, 2.0**-16)), (ml_dtypes.int4, (0.0, 0.0)),
    ],
)  # fmt: skip
def test_default_tolerances_per_dtype(dtype: object, expected: tuple[float, float]) -> None:
    assert default_tolerances(dtype) == expected


def test_default_tolerances_take_the_loosest_like_torch() -> None:
    assert default_tolerances(np.float32, BF16) == (1.6e-2, 1e-5)
    assert default_tolerances(np.float64, np.float32) == (1.3e-6, 1e-5)
    assert DEFAULT_TOLERANCES["float32"] == (1.3e-6, 1e-5)
    with pytest.raises(TypeError, match="at least one dtype"):
        default_tolerances()


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_fp8_defaults_admit_every_one_step_difference(dtype: np.dtype) -> None:
    """Exhaustive: each finite fp8 value against its neighbour passes both ways; equal values too."""
    bits = np.arange(256, dtype=np.uint8).view(dtype)
    values = np.unique(bits[np.isfinite(bits.astype(np.float64))].astype(np.float64)).astype(dtype)
    lo, hi = values[:-1], values[1:]
    assert_close(lo, hi)
    assert_close(hi, lo)
    assert ulp_distance(lo, hi.astype(np.float64)).max() == 1
    two = values[2:][values[2:].astype(np.float64) > 1]  # two steps up within a binade is rejected
    assert not _passes(values[:-2][values[2:].astype(np.float64) > 1], two)


# ---------------------------------------------------------------- assert_close: messages, like torch


def test_message_shape_matches_torch() -> None:
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    b = np.array([[1.0, 2.5], [3.0, 0.0]], np.float32)
    with pytest.raises(AssertionError) as e:
        assert_close(a, b)
    assert str(e.value) == (
        "Tensor-likes are not close!\n\nMismatched elements: 2 / 4 (50.0%)\n"
        "Greatest absolute difference: 4.0 at index (1, 1) (up to 1e-05 allowed)\n"
        "Greatest relative difference: inf at index (1, 1) (up to 1.3e-06 allowed)"
    )


def test_message_for_integers_and_scalars() -> None:
    with pytest.raises(AssertionError) as e:
        assert_close(np.array([1, 2]), np.array([1, 3]))
    assert str(e.value).startswith(
        "Tensor-likes are not equal!\n\nMismatched elements: 1 / 2 (50.0%)\n"
        "Greatest absolute difference: 1 at index (1,)\nGreatest relative difference: 0.333"
    )
    with pytest.raises(AssertionError) as e:
        assert_close(np.float32(1.0), np.float32(2.0))
    assert str(e.value) == (
        "Scalars are not close!\n\nExpected 2.0 but got 1.0.\n"
        "Absolute difference: 1.0 (up to 1e-05 allowed)\nRelative difference: 0.5 (up to 1.3e-06 allowed)"
    )
    with pytest.raises(AssertionError, match=r"9223372036854775812 at index \(0,\)"):  # no int64 overflow
        assert_close(np.array([2**63 + 5], np.uint64), np.array([1], np.uint64))


@pytest.mark.parametrize(
    ("a", "b", "text"),
    [
        (np.int64(1), np.int64(2), "Scalars are not equal!\n\nExpected 2 but got 1.\nAbsolute difference: 1\n"
                                   "Relative difference: 0.5"),
        (np.bool_(True), np.bool_(False), "Scalars are not equal!\n\nExpected False but got True.\n"
                                          "Absolute difference: 1\nRelative difference: inf"),
        (np.float64(0.5), np.float64(0.0), "Scalars are not close!\n\nExpected 0.0 but got 0.5.\n"
                                           "Absolute difference: 0.5 (up to 1e-07 allowed)\n"
                                           "Relative difference: inf (up to 1e-07 allowed)"),
    ],
)  # fmt: skip
def test_zero_dim_messages(a: np.generic, b: np.generic, text: str) -> None:
    with pytest.raises(AssertionError) as e:
        assert_close(a, b)
    assert str(e.value) == text


def test_nan_needs_equal_nan_and_inf_must_match() -> None:
    a = np.array([1.0, np.nan, np.inf])
    assert not _passes(a, a.copy())
    assert _passes(a, a.copy(), equal_nan=True)
    assert not _passes(np.array([np.inf]), np.array([-np.inf]))
    assert not _passes(np.array([np.inf]), np.array([1e308]), rtol=1.0, atol=1.0)


def test_msg_replaces_or_rewrites_the_message() -> None:
    with pytest.raises(AssertionError, match=r"^custom$"):
        assert_close(np.ones(2), np.zeros(2), msg="custom")
    with pytest.raises(AssertionError, match=r"^layer 3: Tensor-likes are not close!"):
        assert_close(np.ones(2), np.zeros(2), msg=lambda m: f"layer 3: {m}")


def test_empty_and_size_one_arrays() -> None:
    assert_close(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))
    assert_close(np.ones(1, BF16), np.ones(1, BF16))
    with pytest.raises(AssertionError, match=r"Mismatched elements: 1 / 1 \(100.0%\)"):
        assert_close(np.ones(1, np.float16), np.zeros(1, np.float16))


def test_complex_uses_the_modulus_and_its_part_tolerances() -> None:
    a = np.array([1 + 1j], np.complex64)
    assert_close(a, a + np.complex64(5e-6j))  # within atol 1e-5
    with pytest.raises(AssertionError, match=r"Greatest relative difference: 0\.447"):
        assert_close(np.array([1 + 1j]), np.array([1 + 2j]))


# ---------------------------------------------------------------- errors


def test_shape_mismatch_names_both_shapes_and_the_fix() -> None:
    with pytest.raises(AssertionError, match=r"'shape' do not match: \(2, 3\) != \(3, 2\)\.\n.*reshape"):
        assert_close(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"actual has shape \(2,\), expected has shape \(3,\); .*reshape"):
        compare(np.zeros(2), np.zeros(3))


def test_dtype_mismatch_names_both_dtypes_and_the_fix() -> None:
    with pytest.raises(AssertionError, match=r"'dtype' do not match: float32 != float64\.\n.*astype"):
        assert_close(np.zeros(2, np.float32), np.zeros(2, np.float64))
    m = compare(np.zeros(2, np.float32), np.zeros(2, np.float64))  # compare accepts mixed dtypes
    assert m.dtype == np.float32 and m.max_abs == 0


def test_tolerances_both_or_neither_and_valid() -> None:
    with pytest.raises(ValueError, match=r"Both 'rtol' and 'atol' .* got no atol"):
        assert_close(np.zeros(1), np.zeros(1), rtol=1e-3)
    with pytest.raises(ValueError, match="got no rtol"):
        compare(np.zeros(1), np.zeros(1), atol=1e-3)
    with pytest.raises(ValueError, match="rtol must be a finite number >= 0, got -1"):
        assert_close(np.zeros(1), np.zeros(1), rtol=-1, atol=0)


def test_uncomparable_dtype_names_the_argument() -> None:
    with pytest.raises(TypeError, match="expected: cannot compare arrays of dtype <U1"):
        compare(np.zeros(1), np.array(["a"]))


# ---------------------------------------------------------------- compare: numbers against loops


def _loop_metrics(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    xs = [float(v) for v in a.astype(np.float64).ravel()]
    ys = [float(v) for v in b.astype(np.float64).ravel()]
    diffs = [abs(x - y) for x, y in zip(xs, ys, strict=True)]
    rels = [0.0 if d == 0 else (math.inf if y == 0 else d / abs(y)) for d, y in zip(diffs, ys, strict=True)]
    signal = sum(y * y for y in ys)
    noise = sum(d * d for d in diffs)
    dot = sum(x * y for x, y in zip(xs, ys, strict=True))
    na, nb = math.sqrt(sum(x * x for x in xs)), math.sqrt(signal)
    return {
        "max_abs": max(diffs), "max_rel": max(rels), "mean_abs": sum(diffs) / len(diffs),
        "sqnr_db": math.inf if noise == 0 else 10 * math.log10(signal / noise), "cosine": dot / (na * nb),
        "max_abs_scaled": max(diffs) / max(abs(y) for y in ys),
    }  # fmt: skip


@pytest.mark.parametrize("dtype", FLOATS)
def test_metrics_equal_a_plain_loop(dtype: np.dtype) -> None:
    rng = np.random.default_rng(3)
    b = rng.standard_normal((4, 5)).astype(dtype)
    a = (b.astype(np.float64) + rng.standard_normal((4, 5)) * 0.01).astype(dtype)
    m, ref = compare(a, b), _loop_metrics(a, b)
    for key, want in ref.items():
        assert getattr(m, key) == pytest.approx(want, rel=1e-9), key
    rtol, atol = default_tolerances(dtype)
    assert m.mismatch_fraction == pytest.approx(1 - _ref_close(a, b, rtol, atol, True).mean())
    assert (m.n, m.shape, m.dtype, m.rtol, m.atol) == (20, (4, 5), dtype, rtol, atol)


def test_ulp_distance_counts_representable_values() -> None:
    one = np.float32(1.0)
    up = np.nextafter(one, np.float32(2))
    assert compare(np.array([up]), np.array([one])).ulp_max == 1
    assert compare(np.array([-0.0], np.float32), np.array([0.0], np.float32)).ulp_max == 0
    tiny = np.array([np.nextafter(np.float64(0), 1)])
    assert compare(-tiny, tiny).ulp_max == 2  # across zero
    assert compare(np.array([1.0078125], BF16), np.array([1.0], np.float64)).ulp_max == 1
    assert compare(np.array([3], np.int32), np.array([7], np.int32)).ulp_max == 4
    # the expected side is rounded to actual's dtype first: a correctly rounded float32 is 0 ULP off
    assert compare(np.array([np.float32(0.1)]), np.array([0.1])).ulp_max == 0


def test_nonfinite_pairs() -> None:
    both = compare(np.array([1.0, np.nan, np.inf]), np.array([1.0, np.nan, np.inf]))
    assert (both.max_abs, both.ulp_max, both.mismatch_fraction, both.cosine) == (0, 0, 0, 1.0)
    assert both.sqnr_db == math.inf and both.nonfinite_mismatch == 0
    one = compare(np.array([1.0, np.nan, 2.0]), np.array([1.0, 5.0, 2.0]))
    assert one.max_abs == math.inf and one.ulp_max == math.inf and one.sqnr_db == -math.inf
    assert one.nonfinite_mismatch == 1 and one.mismatch_fraction == pytest.approx(1 / 3)
    assert one.cosine == pytest.approx(1.0)  # over the pairs where both sides are finite


def test_empty_and_zero_arrays() -> None:
    e = compare(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32))
    assert (e.n, e.max_abs, e.mismatch_fraction, e.cosine, e.sqnr_db) == (0, 0.0, 0.0, 1.0, math.inf)
    z = compare(np.zeros(3), np.zeros(3))
    assert (z.cosine, z.sqnr_db, z.max_rel) == (1.0, math.inf, 0.0)
    nz = compare(np.ones(3), np.zeros(3))
    assert (nz.cosine, nz.sqnr_db, nz.max_rel, nz.max_abs_scaled) == (0.0, -math.inf, math.inf, 1.0)
    s = compare(np.float32(2.0), np.float32(1.0))
    assert (s.n, s.shape, s.max_abs, s.max_rel, s.cosine) == (1, (), 1.0, 1.0, 1.0)


def test_metrics_are_frozen_and_serialise() -> None:
    m = compare(np.ones(2), np.zeros(2))
    assert isinstance(m, Metrics) and not m.within
    with pytest.raises(AttributeError):
        m.max_abs = 0.0  # type: ignore[misc]
    d = m.to_dict()
    assert d["dtype"] == "float64" and d["shape"] == [2] and d["sqnr_db"] == "-inf"


def test_large_magnitudes_do_not_overflow_cosine_or_sqnr() -> None:
    a = np.array([1e300, -1e300])
    m = compare(a, a * (1 + 1e-12))
    assert m.cosine == pytest.approx(1.0) and 200 < m.sqnr_db < 260


# ---------------------------------------------------------------- properties


def _cast(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    with np.errstate(over="ignore"):  # huge float64 values become inf in narrow dtypes, on purpose
        return x.astype(dt)


def _arrays(dtypes: list[np.dtype], finite: bool) -> st.SearchStrategy[np.ndarray]:
    """Float arrays of the given dtypes, shapes up to 3-D including empty and size-1 dims."""

    def build(dt: np.dtype) -> st.SearchStrategy[np.ndarray]:
        shape = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
        elems = st.floats(-1e3, 1e3, allow_nan=False, width=32) if finite else st.floats(width=32)
        return hnp.arrays(np.float64, shape, elements=elems).map(lambda x: _cast(x, dt))

    return st.sampled_from(dtypes).flatmap(build)


@SETTINGS
@given(_arrays(FLOATS, finite=False))
def test_compare_of_an_array_with_itself_is_exact(x: np.ndarray) -> None:
    m = compare(x, x.copy())
    assert (m.max_abs, m.max_rel, m.mean_abs, m.ulp_max, m.mismatch_fraction) == (0, 0, 0, 0, 0)
    assert m.cosine == 1.0 and m.sqnr_db == math.inf and m.nonfinite_mismatch == 0
    assert_close(x, x.copy(), equal_nan=True)


@SETTINGS
@given(
    hnp.arrays(np.float64, st.integers(1, 20), elements=st.floats(-1e3, 1e3).filter(lambda v: abs(v) > 1e-3)),
    hnp.arrays(np.float64, 20, elements=st.floats(-1e3, 1e3)),
    st.floats(1e-3, 1e3),
)
def test_cosine_is_invariant_to_positive_scaling(a: np.ndarray, noise: np.ndarray, c: float) -> None:
    b = a + noise[: a.size]
    assert compare(c * a, b).cosine == pytest.approx(compare(a, b).cosine, abs=1e-9)
    assert compare(-a, a).cosine == pytest.approx(-1.0)


@SETTINGS
@given(
    _arrays([np.dtype(np.float32), np.dtype(np.float64), BF16], finite=False),
    st.floats(-4, 1),
    st.sampled_from([None, (1e-2, 1e-3), (0.0, 0.0)]),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_assert_close_passes_iff_the_reference_says_so(
    b: np.ndarray, log_scale: float, tol: tuple[float, float] | None, equal_nan: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    a = _cast(b.astype(np.float64) * (1 + rng.standard_normal(b.shape) * 10**log_scale), b.dtype)
    rtol, atol = tol if tol is not None else default_tolerances(b.dtype)
    want = bool(np.all(_ref_close(a, b, rtol, atol, equal_nan)))
    kw = {} if tol is None else {"rtol": rtol, "atol": atol}
    assert _passes(a, b, equal_nan=equal_nan, **kw) is want  # type: ignore[arg-type]
    if b.size:
        got = compare(a, b, **kw).mismatch_fraction  # type: ignore[arg-type]
        assert got == pytest.approx(1 - _ref_close(a, b, rtol, atol, True).mean())


@SETTINGS
@given(
    hnp.arrays(
        np.float32,
        st.integers(1, 30),
        elements=st.floats(float(np.float32(-1e30)), float(np.float32(1e30)), width=32),
    )
)
def test_next_float32_is_one_ulp(x: np.ndarray) -> None:
    up = np.nextafter(x, np.float32(np.inf))
    assert compare(up, x).ulp_max == 1
    assert ulp_distance(up, x).tolist() == [1.0] * x.size


# ---------------------------------------------------------------- torch.testing as the peer


def _corpus() -> list[tuple[np.ndarray, np.ndarray, dict[str, object]]]:
    """Pairs across dtypes and tolerances, each clearly inside (x0.25) or outside (x4) its bound."""
    rng = np.random.default_rng(0)
    pairs: list[tuple[np.ndarray, np.ndarray, dict[str, object]]] = []
    for dt in [np.float16, BF16, np.float32, np.float64, np.complex64, np.complex128]:
        for tol in (None, (1e-2, 1e-4), (0.0, 0.0)):
            rtol, atol = tol if tol else default_tolerances(dt)
            kw: dict[str, object] = {} if tol is None else {"rtol": rtol, "atol": atol}
            for factor in (0.0, 0.25, 4.0):
                for shape in [(3, 4), (1,), (), (0, 2)]:
                    b64 = np.asarray(rng.standard_normal(shape) * 4)
                    b = b64.astype(dt)
                    bound = atol + rtol * np.abs(
                        b.astype(np.complex128 if np.dtype(dt).kind == "c" else np.float64)
                    )
                    step = np.where(rng.random(shape) < 0.5, -1, 1) * factor * bound
                    a = (b.astype(np.float64 if np.dtype(dt).kind != "c" else np.complex128) + step).astype(
                        dt
                    )
                    pairs.append((a, b, kw))
    for dt in [np.int32, np.int64, np.uint8, np.bool_]:
        b = rng.integers(0, 2, (5,)).astype(dt)
        pairs += [(b.copy(), b, {}), ((~b if dt == np.bool_ else b + 1).astype(dt), b, {})]
    nan = np.array([1.0, np.nan], np.float32)
    pairs += [(nan, nan.copy(), {}), (nan, nan.copy(), {"equal_nan": True})]
    pairs += [(np.array([np.inf], np.float32), np.array([np.inf], np.float32), {})]
    return pairs


def test_pass_fail_agrees_with_torch_testing_assert_close() -> None:
    torch = pytest.importorskip("torch")

    def to_torch(x: np.ndarray) -> object:
        if x.dtype == BF16:
            return torch.from_numpy(np.asarray(x.astype(np.float32))).to(torch.bfloat16)
        return torch.from_numpy(np.asarray(x).copy())

    corpus = _corpus()
    disagree = []
    for a, b, kw in corpus:
        try:
            torch.testing.assert_close(to_torch(a), to_torch(b), **kw)
            theirs, their_msg = True, ""
        except AssertionError as exc:
            theirs, their_msg = False, str(exc)
        ours = _passes(a, b, **kw)
        if ours != theirs:
            disagree.append((a.dtype, a.shape, kw))
        elif not ours and a.ndim:  # same header and mismatch count
            with pytest.raises(AssertionError) as e:
                assert_close(a, b, **kw)  # type: ignore[arg-type]
            assert str(e.value).splitlines()[:3] == their_msg.splitlines()[:3]
    assert not disagree, disagree
    assert sum(not _passes(a, b, **kw) for a, b, kw in corpus) > 30  # the corpus has failures to agree on
