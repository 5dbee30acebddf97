"""Text ops of the ONNX operator specification: TfIdfVectorizer (int64/int32 or string tokens).

The n-gram pool (``pool_int64s`` or ``pool_strings`` grouped by ``ngram_counts``) maps each n-gram to
an output column (``ngram_indexes``); every row counts the pool's n-grams of length
``min_gram_length..max_gram_length`` whose items are ``1..max_skip_count+1`` apart (unigrams once),
then weights the counts by ``mode`` (TF, IDF, TFIDF). The executor kernel is host numpy code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape
from .common import Arr
from .registry import HOST, define

__all__ = ["tfidf_vectorize"]

_MODES = ("TF", "IDF", "TFIDF")


def _pool(attrs: dict[str, Any]) -> dict[tuple, int]:
    """n-gram tuple -> its id (0-based, in pool order over all sizes); later duplicates win."""
    pool = list(attrs.get("pool_int64s") or attrs.get("pool_strings") or [])
    counts = list(attrs.get("ngram_counts") or [])
    out: dict[tuple, int] = {}
    nid = 0
    for i, start in enumerate(counts):
        end = counts[i + 1] if i + 1 < len(counts) else len(pool)
        size = i + 1
        for j in range(start, start + (end - start) // size * size, size):
            out[tuple(pool[j : j + size])] = nid
            nid += 1
    return out


def tfidf_vectorize(x: Arr, attrs: dict[str, Any]) -> Arr:
    """ONNX TfIdfVectorizer of ``x`` ([C] or [B, C] tokens) with the op's attributes; float32 output."""
    x = np.asarray(x)
    mode = attrs.get("mode", "TF")
    if mode not in _MODES:
        raise ValueError(f"TfIdfVectorizer: mode {mode!r} is not one of {_MODES}")
    lo, hi = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
    skips = int(attrs.get("max_skip_count", 0))
    indexes = list(attrs["ngram_indexes"])
    size = max(indexes) + 1
    grams = {g: indexes[i] for g, i in _pool(attrs).items() if lo <= len(g) <= hi}
    rows = x.reshape(1, -1) if x.ndim < 2 else x
    if x.ndim > 2:
        raise ValueError(f"TfIdfVectorizer: input must be [C] or [B, C], got {x.shape}")
    counts = np.zeros((rows.shape[0], size), np.int64)
    for r, row in enumerate(rows.tolist()):
        c = len(row)
        for n in range(lo, hi + 1):
            for d in range(1, (skips if n > 1 else 0) + 2):
                for s in range(c - (n - 1) * d):
                    col = grams.get(tuple(row[s : s + (n - 1) * d + 1 : d]))
                    if col is not None:
                        counts[r, col] += 1
    w = attrs.get("weights")
    w = np.asarray(w, np.float32) if w is not None and len(w) else None
    if mode == "TF":
        y = counts.astype(np.float32)
    elif mode == "IDF":
        y = (counts > 0).astype(np.float32) * (w if w is not None else np.float32(1))
    else:
        y = counts.astype(np.float32) * (w if w is not None else np.float32(1))
    return y.astype(np.float32).reshape(size) if x.ndim < 2 else y.astype(np.float32)


def _tfidf_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    size = max(n.attrs["ngram_indexes"]) + 1
    x = ctx.shape(0)
    if x is None:
        return [(np.dtype(np.float32), None)]
    return [(np.dtype(np.float32), (size,) if len(x) < 2 else (x[0], size))]


def _run_tfidf(n: Node, x: list[Arr]) -> list[Arr]:
    return [tfidf_vectorize(x[0], n.attrs)]


define(
    "TfIdfVectorizer", attrs={"max_skip_count": 0, "mode": "TF"}, shape=_tfidf_rule, kernel=_run_tfidf,
    uses=(HOST,), dtypes="int32/int64/string", doc="n-gram counts weighted TF, IDF or TFIDF",
)  # fmt: skip
