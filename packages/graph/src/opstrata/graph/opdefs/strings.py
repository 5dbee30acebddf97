"""String tensor ops (ONNX operator spec: StringNormalizer, StringConcat, StringSplit, RegexFullMatch, and
Equal and Cast/CastLike on strings).

STRING tensors are numpy object arrays of Python ``str`` (what onnx.numpy_helper gives); the importer
maps ONNX's STRING element type to ``np.dtype(object)``. Kernels are host numpy code (opstrata.ops
has no string kernels); the memory planner keeps object arrays out of the byte arena. Equal on
strings imports as ``ai.opstrata::StringEqual`` (exported back as Equal), chosen at import time from
the inputs' dtypes (graph inputs, initializers and outputs of the ops here are typed by then); Cast
and CastLike to or from STRING import as ``ai.opstrata::StringCast`` the same way (exported as Cast).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .._ir import OPSTRATA_DOMAIN, Node
from .._shape_rules import RuleContext, bcast
from ..onnx.context import ImportContext
from ..onnx.export import register_export
from .common import Arr
from .registry import HOST, define, lookup

__all__: list[str] = []

_OBJ = np.dtype(object)


def _strings(x: Any, what: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind in "US":
        arr = arr.astype(object)
    if arr.dtype != _OBJ:
        raise TypeError(f"{what} must be a string tensor, got {arr.dtype}")
    return arr


def _mark_strings(ctx: ImportContext, name: str) -> None:
    ctx.graph.values[name].dtype = _OBJ


def _is_string(ctx: ImportContext, name: str) -> bool:
    if not name:
        return False
    arr = ctx.graph.initializers.get(name)
    if arr is not None:
        return arr.dtype.hasobject
    v = ctx.graph.values.get(name)
    return v is not None and v.dtype is not None and v.dtype.hasobject


def _string_rule(n: Node, ctx: RuleContext) -> list:
    return [(_OBJ, ctx.shape(0))]


# --------------------------------------------------------------------------- StringNormalizer


def _import_normalizer(ctx: ImportContext) -> None:
    a = ctx.attrs
    action = a.get("case_change_action", "NONE")
    if action not in ("NONE", "LOWER", "UPPER"):
        raise ctx.unsupported(f"StringNormalizer case_change_action={action!r}; use NONE, LOWER or UPPER")
    locale = a.get("locale", "")
    if locale and not locale.lower().startswith(("en", "c", "posix")):
        raise ctx.unsupported(f"StringNormalizer locale={locale!r}: only en_US/C case rules are implemented")
    attrs = {
        "case_change_action": action,
        "is_case_sensitive": int(a.get("is_case_sensitive", 0)),
        "stopwords": list(a.get("stopwords", [])),
    }
    ctx.emit("StringNormalizer", ctx.inputs, ctx.outputs, attrs)
    _mark_strings(ctx, ctx.outputs[0])


def _run_normalizer(n: Node, x: list[Arr]) -> list[Arr]:
    data = _strings(x[0], "StringNormalizer input")
    if data.ndim not in (1, 2) or (data.ndim == 2 and data.shape[0] != 1):
        raise ValueError(f"StringNormalizer takes a [C] or [1, C] tensor, got shape {list(data.shape)}")
    words = list(data.reshape(-1))
    stops = n.attrs.get("stopwords", [])
    if n.attrs.get("is_case_sensitive", 0):
        words = [w for w in words if w not in set(stops)]
    else:
        low = {s.lower() for s in stops}
        words = [w for w in words if w.lower() not in low]
    action = n.attrs.get("case_change_action", "NONE")
    if action == "LOWER":
        words = [w.lower() for w in words]
    elif action == "UPPER":
        words = [w.upper() for w in words]
    out = np.array(words or [""], dtype=object)
    return [out.reshape(1, -1) if data.ndim == 2 else out]


def _normalizer_rule(n: Node, ctx: RuleContext) -> list:
    s = ctx.shape(0)
    return [(_OBJ, None if s is None else (*s[:-1], None))]


# --------------------------------------------------------------------------- StringConcat, RegexFullMatch


def _import_concat(ctx: ImportContext) -> None:
    ctx.emit("StringConcat", ctx.inputs, ctx.outputs)
    _mark_strings(ctx, ctx.outputs[0])


def _run_concat(n: Node, x: list[Arr]) -> list[Arr]:
    a, b = _strings(x[0], "StringConcat X"), _strings(x[1], "StringConcat Y")
    return [np.asarray(np.add(a, b), dtype=object)]


def _concat_rule(n: Node, ctx: RuleContext) -> list:
    return [(_OBJ, bcast(ctx, [0, 1]))]


def _import_regex(ctx: ImportContext) -> None:
    pattern = ctx.attrs.get("pattern", "")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ctx.unsupported(
            f"RegexFullMatch pattern {pattern!r} is not a valid regex here ({exc})"
        ) from None
    ctx.emit("RegexFullMatch", ctx.inputs, ctx.outputs, {"pattern": pattern})


def _run_regex(n: Node, x: list[Arr]) -> list[Arr]:
    data = _strings(x[0], "RegexFullMatch X")
    rx = re.compile(n.attrs.get("pattern", ""))
    out = np.fromiter((rx.fullmatch(s) is not None for s in data.reshape(-1)), dtype=bool, count=data.size)
    return [out.reshape(data.shape)]


# --------------------------------------------------------------------------- StringSplit


def _import_split(ctx: ImportContext) -> None:
    attrs: dict[str, Any] = {"delimiter": ctx.attrs.get("delimiter", "")}
    if "maxsplit" in ctx.attrs:
        attrs["maxsplit"] = int(ctx.attrs["maxsplit"])
    ctx.emit("StringSplit", ctx.inputs, ctx.outputs, attrs)
    _mark_strings(ctx, ctx.outputs[0])


def _run_split(n: Node, x: list[Arr]) -> list[Arr]:
    data = _strings(x[0], "StringSplit X")
    sep = n.attrs.get("delimiter", "") or None
    maxsplit = n.attrs.get("maxsplit", -1)
    parts = [s.split(sep, maxsplit) for s in data.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    out = np.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        out[i, : len(p)] = p
    counts = np.array([len(p) for p in parts], np.int64).reshape(data.shape)
    return [out.reshape(*data.shape, width), counts]


def _split_rule(n: Node, ctx: RuleContext) -> list:
    s = ctx.shape(0)
    return [(_OBJ, None if s is None else (*s, None)), (np.dtype(np.int64), s)]


# --------------------------------------------------------------------------- Equal on strings


_EQUAL = lookup("Equal")
_equal_import = _EQUAL.importer if _EQUAL is not None else None


def _import_equal(ctx: ImportContext) -> None:
    if any(_is_string(ctx, x) for x in ctx.inputs[:2]):
        ctx.emit("StringEqual", ctx.inputs, ctx.outputs, domain=OPSTRATA_DOMAIN)
        return
    if _equal_import is not None:
        _equal_import(ctx)
    else:
        ctx.emit("Equal", ctx.inputs, ctx.outputs, dict(ctx.attrs))


def _run_equal(n: Node, x: list[Arr]) -> list[Arr]:
    a, b = _strings(x[0], "Equal A"), _strings(x[1], "Equal B")
    return [np.asarray(np.equal(a, b), dtype=bool)]


def _equal_rule(n: Node, ctx: RuleContext) -> list:
    return [(np.dtype(bool), bcast(ctx, [0, 1]))]


# --------------------------------------------------------------------------- Cast to/from strings


_CAST, _CASTLIKE = lookup("Cast"), lookup("CastLike")
_cast_import = _CAST.importer if _CAST is not None else None
_castlike_import = _CASTLIKE.importer if _CASTLIKE is not None else None


def _import_cast(ctx: ImportContext) -> None:
    from ..onnx.types import dtype_from_onnx

    to = dtype_from_onnx(ctx.attrs["to"], f"node '{ctx.name}'")
    if to.hasobject or _is_string(ctx, ctx.input(0)):
        ctx.emit("StringCast", ctx.inputs, ctx.outputs, {"to": to}, domain=OPSTRATA_DOMAIN)
        ctx.graph.values[ctx.outputs[0]].dtype = to
    elif _cast_import is not None:
        _cast_import(ctx)


def _import_castlike(ctx: ImportContext) -> None:
    v = ctx.graph.values.get(ctx.input(1))
    arr = ctx.graph.initializers.get(ctx.input(1))
    to = arr.dtype if arr is not None else v.dtype if v is not None else None
    if to is not None and (to.hasobject or _is_string(ctx, ctx.input(0))):
        ctx.emit("StringCast", [ctx.input(0)], ctx.outputs, {"to": to}, domain=OPSTRATA_DOMAIN)
        ctx.graph.values[ctx.outputs[0]].dtype = to
    elif _castlike_import is not None:
        _castlike_import(ctx)
    else:
        ctx.emit("CastLike", ctx.inputs, ctx.outputs, dict(ctx.attrs))


def _format(v: Any) -> str:
    """ONNX's string form of a number as onnxruntime writes it: floats ``%.8g``, INF/-INF/NaN, ints, bools 1/0."""
    if isinstance(v, (bool, np.bool_)):
        return "1" if v else "0"
    if isinstance(v, (float, np.floating)) or type(v).__name__ == "bfloat16":
        f = float(v)
        if np.isnan(f):
            return "NaN"
        if np.isinf(f):
            return "INF" if f > 0 else "-INF"
        return f"{f:.8g}"  # what onnxruntime writes (8 significant digits, %g style)
    return str(v)


def _parse(s: str, to: np.dtype) -> Any:
    """A string as a number of dtype ``to`` (plain or scientific; INF/+INF/-INF/NaN in any case)."""
    t = s.strip()
    if to.kind in "iu":
        try:
            return int(t)
        except ValueError:
            return int(float(t))  # "100.5" -> 100 (the spec allows it)
    f = float(t)
    return f != 0.0 if to.kind == "b" else f


def _run_string_cast(n: Node, x: list[Arr]) -> list[Arr]:
    to = np.dtype(n.attrs["to"])
    data = np.asarray(x[0])
    if to.hasobject:
        if data.dtype.hasobject:
            return [data.copy()]
        out = np.empty(data.shape, dtype=object)
        flat = out.reshape(-1)
        for i, v in enumerate(data.reshape(-1)):
            flat[i] = _format(v)
        return [out]
    vals = [_parse(str(s), to) for s in _strings(data, "Cast input").reshape(-1)]
    if to.kind in "iu":
        return [
            np.array(vals, dtype=np.int64 if to.kind == "i" else np.uint64).astype(to).reshape(data.shape)
        ]
    return [np.array(vals, dtype=np.float64).astype(to).reshape(data.shape)]


define(
    "StringNormalizer", attrs={"case_change_action": "NONE", "is_case_sensitive": 0, "stopwords": []},
    importer=_import_normalizer, shape=_normalizer_rule, kernel=_run_normalizer, uses=(HOST,), dtypes="string",
    doc="drops stopwords and changes case of a [C] or [1, C] string tensor",
)  # fmt: skip
define(
    "StringConcat", importer=_import_concat, shape=_concat_rule, kernel=_run_concat, uses=(HOST,),
    dtypes="string", doc="elementwise (broadcast) concatenation of two string tensors",
)  # fmt: skip
define(
    "RegexFullMatch", attrs={"pattern": ""}, importer=_import_regex,
    shape=lambda n, ctx: [(np.dtype(bool), ctx.shape(0))], kernel=_run_regex, uses=(HOST,), dtypes="string",
    doc="bool tensor: each string fully matches `pattern` (Python re syntax, RE2's common subset)",
)  # fmt: skip
define(
    "StringSplit", attrs={"delimiter": ""}, importer=_import_split, shape=_split_rule, kernel=_run_split,
    uses=(HOST,), dtypes="string",
    doc="splits each string on `delimiter` (whitespace runs when empty): parts padded with '' and counts",
)  # fmt: skip
define(
    "StringEqual", domain=OPSTRATA_DOMAIN, shape=_equal_rule, kernel=_run_equal, uses=(HOST,), dtypes="string",
    doc="Equal on string tensors (imported from ONNX Equal; exported back as Equal)",
)  # fmt: skip
define(
    "StringCast", domain=OPSTRATA_DOMAIN, attrs={"to": _OBJ},
    shape=lambda n, ctx: [(np.dtype(n.attrs["to"]), ctx.shape(0))], kernel=_run_string_cast, uses=(HOST,),
    dtypes="all", doc="Cast/CastLike to or from string tensors (ONNX's number formatting; exported back as Cast)",
)  # fmt: skip
if _CAST is not None:
    _CAST.imports(_import_cast)
if _CASTLIKE is not None:
    _CASTLIKE.imports(_import_castlike)
if _EQUAL is not None:
    _EQUAL.imports(_import_equal)  # Equal's own row (elementwise.py) keeps its numeric kernel
register_export(
    "StringCast",
    lambda node, ctx: ctx.emit("Cast", node.inputs, node.outputs, to=node.attrs["to"]),
    domain=OPSTRATA_DOMAIN,
)
register_export(
    "StringEqual", lambda node, ctx: ctx.emit("Equal", node.inputs, node.outputs), domain=OPSTRATA_DOMAIN
)
