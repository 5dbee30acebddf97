"""ONNX Attention in full through the graph against onnxruntime: KV cache (past/present), nonpad_kv_seqlen, softcap,
qk_matmul_output in every mode, softmax_precision, sliding windows and grouped-query heads in 3-D and 4-D; the
plain form still imports onto the fused ai.opstrata::Attention."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


import functools  # noqa: E402

import _onnx_check  # noqa: E402
from _onnx_check import F, const, feed, rng  # noqa: E402

from opstrata.graph import from_onnx  # noqa: E402

node_model = functools.partial(_onnx_check.node_model, infer_types=False)
check_against_ort = functools.partial(
    _onnx_check.check_against_ort, opset=22, infer_types=False, floor=float(np.finfo(np.float32).min)
)


def _qkv4(b: int = 2, hq: int = 4, hk: int = 2, n: int = 3, m: int = 5, d: int = 8) -> list[Any]:
    return [feed(F(b, hq, n, d)), feed(F(b, hk, m, d)), feed(F(b, hk, m, d))]


def _qkv3(b: int = 2, hq: int = 4, hk: int = 2, n: int = 3, m: int = 5, d: int = 8) -> list[Any]:
    return [feed(F(b, n, hq * d)), feed(F(b, m, hk * d)), feed(F(b, m, hk * d))]


def _ops(model: Any) -> list[str]:
    return [n.qualified_type for n in from_onnx(model).nodes]


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_kv_cache_present_and_qk_output(causal: int, mode: int) -> None:
    past = [None, feed(F(2, 2, 4, 8)), feed(F(2, 2, 4, 8))]
    check_against_ort(
        "Attention",
        [*_qkv4(), *past],
        {"is_causal": causal, "qk_matmul_output_mode": mode},
        n_out=4,
        opset=23,
    )


def test_attention_3d_gqa_with_past_and_mask() -> None:
    mask = rng.uniform(-1, 0, (3, 9)).astype(np.float32)  # (N, past + M)
    past = [feed(mask), feed(F(2, 2, 4, 8)), feed(F(2, 2, 4, 8))]
    check_against_ort(
        "Attention", [*_qkv3(), *past], {"q_num_heads": 4, "kv_num_heads": 2, "scale": 0.3}, n_out=3, opset=23
    )


@pytest.mark.parametrize("softcap", [0.5, 3.0])
def test_attention_softcap(softcap: float) -> None:
    check_against_ort("Attention", _qkv4(), {"softcap": softcap}, opset=23)


def test_attention_softmax_precision_double() -> None:
    check_against_ort("Attention", _qkv4(), {"softmax_precision": 11}, opset=23)


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_nonpad_kv_seqlen(causal: int) -> None:
    lens = feed(np.array([5, 3], np.int64))
    check_against_ort("Attention", [*_qkv4(), None, None, None, lens], {"is_causal": causal}, opset=24)


def test_attention_bool_mask_with_fully_masked_row_outputs_zeros() -> None:
    mask = np.ones((3, 5), bool)
    mask[1] = False
    want = check_against_ort("Attention", [*_qkv4(), feed(mask)], {"softcap": 2.0}, opset=23)
    assert not np.any(want["out0"][:, :, 1])


def test_attention_plain_form_stays_fused() -> None:
    model, _ = node_model("Attention", _qkv4(), {"is_causal": 1}, 1, 23)
    assert "ai.opstrata::Attention" in _ops(model) and "Attention" not in _ops(model)
    model, _ = node_model("Attention", _qkv4(), {"softcap": 1.0}, 1, 23)
    assert _ops(model) == ["Attention"]


def test_attention_one_head_count_only_is_refused() -> None:
    from opstrata.graph import UnsupportedOpError

    model, _ = node_model("Attention", _qkv3(), {"q_num_heads": 4}, 1, 23)
    with pytest.raises(UnsupportedOpError, match="only one of the two given"):
        from_onnx(model)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rank", [3, 4])
def test_rotary_embedding_with_position_ids(interleaved: int, rank: int) -> None:
    b, h, s, d = 2, 3, 4, 8
    x = F(b, h, s, d) if rank == 4 else F(b, s, h * d)
    attrs: dict[str, Any] = {"interleaved": interleaved, "rotary_embedding_dim": 4}
    if rank == 3:
        attrs["num_heads"] = h
    pos = feed(rng.integers(0, 6, (b, s)).astype(np.int64))
    check_against_ort("RotaryEmbedding", [feed(x), const(F(6, 2)), const(F(6, 2)), pos], attrs, opset=23)


def test_rotary_embedding_per_batch_caches() -> None:
    check_against_ort(
        "RotaryEmbedding", [feed(F(2, 3, 4, 6)), feed(F(2, 4, 3)), feed(F(2, 4, 3))], {}, opset=23
    )


@pytest.mark.parametrize(("left", "right", "causal"), [(2, -1, 1), (1, 2, 0)])
def test_attention_sliding_window(left: int, right: int, causal: int) -> None:
    attrs = {"left_window_size": left, "right_window_size": right, "is_causal": causal}
    check_against_ort("Attention", _qkv4(n=5), attrs, opset=25)
