"""The generator: simplified :mod:`._codegen_ir` trees -> Python source of a blocked, fused numpy kernel.

The emitted function walks ``(rows, cols)`` views of the broadcast inputs in cache-sized tiles
(:mod:`._chunking`) and evaluates the whole chain on one tile before the next, every step a ufunc
writing ``out=`` into a scratch buffer allocated once per call. Buffers are assigned by liveness (a
buffer is reused once its value's last reader has run; an op may overwrite a dying operand in place),
common subexpressions are computed once (the IR is hash-consed), and the root writes straight into
the result when no cast is needed. The source is compiled once with :func:`compile` and cached by the
expression's structure and dtype. This is the loop-fusion code generation of numexpr and of XLA's
CPU elementwise emitter, in Python over numpy ufuncs.

Dtypes: the kernel's ``dtype`` is any float dtype; float16/bfloat16/float8 compute in float32 and round
once at the end; inputs of any numeric dtype are converted tile by tile. A comparison at the root gives
a bool result. Reductions accumulate in the compute dtype.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .._dtypes import ALL_DTYPES, FLOAT_DTYPES, as_dtype, bool_, compute_dtype
from ..kernels import chunking as _chunking
from ..kernels.chunking import as_rows, reshape_view, row_tile
from ..kernels.erf import erf_values
from ..native.library import count
from .ir import OPS, CodegenError, Expr, kind, simplify, variables
from .vm import VMProgram, vm_bind, vm_program, vm_run

__all__ = ["ElementwiseKernel", "cache_clear", "cache_info", "compile_expr"]

_K = math.sqrt(2.0 / math.pi)
_UFUNC = {
    "add": "add", "sub": "subtract", "mul": "multiply", "div": "true_divide", "pow": "power",
    "maximum": "maximum", "minimum": "minimum", "lt": "less", "le": "less_equal", "gt": "greater",
    "ge": "greater_equal", "eq": "equal", "ne": "not_equal", "neg": "negative", "abs": "absolute",
    "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh",
}  # fmt: skip


def _steps(op: str, o: str, a: list[str]) -> list[str]:
    """Source lines computing ``op(*a)`` into buffer ``o`` (ufuncs with ``out=``, in place where possible)."""
    if op in ("maximum", "minimum"):  # numpy has no SIMD loop for max/min with a scalar: use a tile
        a = [f"@{v}" if not v.isidentifier() or v.startswith("_") else v for v in a]
    if op in _UFUNC:
        return [f"np.{_UFUNC[op]}({', '.join(a)}, out={o})"]
    x = a[0]
    table: dict[str, list[str]] = {
        "rsqrt": [f"np.sqrt({x}, out={o})", f"np.reciprocal({o}, out={o})"],
        "erf": [f"_erf({x}, out={o})"],
        "sigmoid": [f"np.negative({x}, out={o})", f"np.exp({o}, out={o})", f"np.add({o}, 1.0, out={o})",
                    f"np.reciprocal({o}, out={o})"],
        "relu": [f"np.maximum({x}, @0.0, out={o})"],  # @: a constant the emitter expands to a tile
        "silu": [f"np.negative({x}, out={o})", f"np.exp({o}, out={o})", f"np.add({o}, 1.0, out={o})",
                 f"np.true_divide({x}, {o}, out={o})"],
        "gelu": [f"np.multiply({x}, {1 / math.sqrt(2.0)!r}, out={o})", f"_erf({o}, out={o})",
                 f"np.add({o}, 1.0, out={o})", f"np.multiply({o}, {x}, out={o})",
                 f"np.multiply({o}, 0.5, out={o})"],
        "gelu_tanh": [f"np.multiply({x}, {x}, out={o})", f"np.multiply({o}, {_K * 0.044715!r}, out={o})",
                      f"np.add({o}, {_K!r}, out={o})", f"np.multiply({o}, {x}, out={o})",
                      f"np.tanh({o}, out={o})", f"np.add({o}, 1.0, out={o})",
                      f"np.multiply({o}, {x}, out={o})", f"np.multiply({o}, 0.5, out={o})"],
        "to_float": [f"np.copyto({o}, {x})"],
    }  # fmt: skip
    if op == "where":
        first = [] if o == a[2] else [f"np.copyto({o}, {a[2]})"]
        return [*first, f"np.copyto({o}, {a[1]}, where={a[0]})"]
    return table[op]


#: Operand positions an op may overwrite in place (it reads them only before its first write).
_ALIAS: dict[str, tuple[int, ...]] = {"where": (2,), "gelu": (), "gelu_tanh": (), "silu": (), "erf": (0,)}


def _literal(v: float) -> str:
    if math.isnan(v):
        return "_nan"
    if math.isinf(v):
        return "_inf" if v > 0 else "(-_inf)"
    return repr(v)


def _topo(root: Expr) -> list[Expr]:
    """Unique non-leaf nodes in evaluation order (post-order; a shared subtree appears once)."""
    order: list[Expr] = []
    seen: set[Expr] = set()
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n in seen or n.op in ("var", "const"):
            continue
        seen.add(n)
        stack.append((n, True))
        stack.extend((a, False) for a in reversed(n.args))
    return order


class _Emitter:
    """Assigns scratch buffers by liveness and collects the tile body's source lines."""

    def __init__(self, nodes: list[Expr], names: dict[str, str], root_out: str | None) -> None:
        self.nodes, self.names, self.root_out = nodes, names, root_out
        self.last = {a: k for k, n in enumerate(nodes) for a in n.args}
        self.reg: dict[Expr, str] = {}
        self.free: dict[str, list[str]] = {"f": [], "b": []}
        self.count: dict[str, int] = {"f": 0, "b": 0}
        self.body: list[str] = []
        self.tiles: dict[str, str] = {}  # literal -> name of a constant tile (for max/min)

    def _expand(self, line: str) -> str:
        """Replace ``@<literal>`` operands by constant tiles ``q<j>`` filled once per call."""
        parts = line.split("@")
        for i in range(1, len(parts)):
            lit, sep, rest = parts[i].partition(",")
            name = self.tiles.setdefault(lit, f"q{len(self.tiles)}")
            parts[i] = name + sep + rest
        return "".join(parts)

    def operand(self, e: Expr) -> str:
        if e.op == "var":
            return self.names[e.attr]
        if e.op == "const":
            return _literal(e.value)
        return self.reg[e]

    def _new(self, k: str) -> str:
        if self.free[k]:
            return self.free[k].pop()
        self.count[k] += 1
        return f"{k}{self.count[k] - 1}"

    def _target(self, k: int, n: Expr, dying: list[Expr]) -> str:
        if n is self.nodes[-1] and self.root_out is not None:
            return self.root_out
        for i in _ALIAS.get(n.op, range(len(n.args))):
            a = n.args[i]
            if a in dying and kind(a) == kind(n):
                dying.remove(a)
                return self.reg[a]
        return self._new(kind(n))

    def run(self) -> str:
        """Emit every node; return the operand holding the root's value."""
        for k, n in enumerate(self.nodes):
            dying = [a for a in dict.fromkeys(n.args) if a in self.reg and self.last[a] == k]
            ops = [self.operand(a) for a in n.args]
            self.reg[n] = self._target(k, n, dying)
            self.body += [self._expand(line) for line in _steps(n.op, self.reg[n], ops)]
            for a in dying:
                self.free[kind(a)].append(self.reg[a])
        return self.reg[self.nodes[-1]] if self.nodes else ""


def _reduce_lines(op: str, axis: Any, v: str) -> list[str]:
    if op == "reduce_max":
        part = f"{v}.max(axis=1)" if axis is not None else f"{v}.max()"
        return ["acc = out[rs]" if axis is not None else "acc = out", f"np.maximum(acc, {part}, out=acc)"]
    part = f"{v}.sum(axis=1)" if axis is not None else f"{v}.sum()"
    return ["acc = out[rs]" if axis is not None else "acc = out", f"np.add(acc, {part}, out=acc)"]


def generate(expr: Expr, dtype: np.dtype) -> tuple[str, list[str], Expr]:
    """(source of ``kernel(...)``, input names, simplified expression) for ``expr`` in ``dtype``."""
    names = variables(expr)
    simple = simplify(expr)
    red = simple if simple.op.startswith("reduce_") else None
    body_root = red.args[0] if red is not None else simple
    direct = red is None and (kind(body_root) == "b" or compute_dtype(dtype) == dtype)
    leaf_root = body_root.op in ("var", "const")
    local = {n: f"x{i}" for i, n in enumerate(names)}
    nodes = _topo(body_root)
    em = _Emitter(nodes, local, "o" if direct and not leaf_root else None)
    value = em.run() if not leaf_root else em.operand(body_root)
    tail: list[str]
    if red is not None:
        if leaf_root:  # sum(x) / sum(2.0): the reduction needs a full tile to reduce
            em.count["f"] += 1
            reg = f"f{em.count['f'] - 1}"
            em.body.append(f"np.copyto({reg}, {value})")
            value = reg
        tail = _reduce_lines(red.op, red.attr, value)
    elif direct and not leaf_root:
        tail = []
    else:
        tail = [f"np.copyto(o, {value}, casting='unsafe')"]
    params = [f"i{i}" for i in range(len(names))] + ["out"] + [f"k{i}" for i in range(len(names))]
    params += [f"t{i}" for i in range(len(names))]
    src = [
        f"def kernel({', '.join([*params, 'R', 'C', 'rb', 'cb'])}):",
        f'    """{_summary(simple, len(nodes))}  (generated by opstrata.ops.codegen; inputs: '
        + ", ".join(f"i{i}={n}" for i, n in enumerate(names))
        + ')"""',
    ]
    src += [f"    _cv{i} = np.empty((rb, cb), _cdt) if k{i} else None" for i in range(len(names))]
    src += [f"    _f{i} = np.empty((rb, cb), _cdt)" for i in range(em.count["f"])]
    src += [f"    _b{i} = np.empty((rb, cb), np.bool_)" for i in range(em.count["b"])]
    src += [f"    _{c} = np.full((rb, cb), {lit}, _cdt)" for lit, c in em.tiles.items()]
    src += ["    with np.errstate(all='ignore'):", "        for r0 in range(0, R, rb):",
            "            rs = slice(r0, r0 + rb)", "            nr = min(rb, R - r0)",
            "            for c0 in range(0, C, cb):", "                cs = slice(c0, c0 + cb)",
            "                full = nr == rb and min(cb, C - c0) == cb",
            "                nc = min(cb, C - c0)"]  # fmt: skip
    ind = " " * 16
    for i in range(em.count["f"]):
        src.append(f"{ind}f{i} = _f{i} if full else _f{i}[:nr, :nc]")
    for i in range(em.count["b"]):
        src.append(f"{ind}b{i} = _b{i} if full else _b{i}[:nr, :nc]")
    for c in em.tiles.values():
        src.append(f"{ind}{c} = _{c} if full else _{c}[:nr, :nc]")
    for i in range(len(names)):
        src.append(f"{ind}x{i} = i{i}[:nr] if t{i} else i{i}[rs, cs]  # t: a bias laid out as one tile")
        src.append(f"{ind}if k{i}:")
        src.append(f"{ind}    x{i} = _cast(x{i}, _cv{i} if full else _cv{i}[:nr, :nc])")
    if red is None:
        src.append(f"{ind}o = out[rs, cs]")
    src += [ind + line for line in em.body + tail]
    return "\n".join(src) + "\n", names, simple


def _summary(e: Expr, n_nodes: int) -> str:
    """The expression for the kernel's docstring, or its size when printing it would be long."""
    return repr(e)[:200] if n_nodes <= 40 else f"<{n_nodes} ops, root {e.op}>"


def _cast(x: np.ndarray, buf: np.ndarray) -> np.ndarray:
    np.copyto(buf, x, casting="unsafe")
    return buf


class ElementwiseKernel:
    """A compiled elementwise chain: call it with the inputs by name; ``source`` is the generated code."""

    def __init__(self, expr: Expr, dtype: np.dtype) -> None:
        self.expr, self.dtype = expr, dtype
        self.compute_dtype = compute_dtype(dtype)
        self.source, self.inputs, self.simplified = generate(expr, dtype)
        red = self.simplified if self.simplified.op.startswith("reduce_") else None
        self.reduction: tuple[str, int | None] | None = None if red is None else (red.op, red.attr)
        root = red.args[0] if red is not None else self.simplified
        self.out_dtype = bool_ if red is None and kind(root) == "b" else dtype
        ns: dict[str, Any] = {"np": np, "_cdt": self.compute_dtype, "_erf": erf_values, "_cast": _cast,
                              "_inf": np.inf, "_nan": np.nan}  # fmt: skip
        exec(compile(self.source, f"<opstrata.codegen {expr.digest}>", "exec"), ns)
        self._fn: Callable[..., None] = ns["kernel"]
        #: float32 chains also get a native register program (one C call; the numpy kernel when the
        #: native library is off or unbuildable, or the chain is beyond the VM)
        self.program: VMProgram | None = (
            vm_program(self.simplified, self.inputs) if red is None and dtype == np.float32 else None
        )

    def __repr__(self) -> str:
        return f"ElementwiseKernel({self.simplified!r}, dtype={self.dtype}, inputs={self.inputs})"

    def _arrays(self, inputs: dict[str, Any]) -> tuple[list[np.ndarray], tuple[int, ...]]:
        missing = [n for n in self.inputs if n not in inputs]
        extra = [n for n in inputs if n not in self.inputs]
        if missing or extra:
            raise CodegenError(
                f"ElementwiseKernel: expected inputs ({', '.join(self.inputs)}), got ({', '.join(inputs)})"
                + (f"; missing {missing}" if missing else "")
                + (f"; unexpected {extra}" if extra else "")
            )
        arrays = [np.asarray(inputs[n]) for n in self.inputs]
        for n, a in zip(self.inputs, arrays, strict=True):
            if a.dtype not in ALL_DTYPES:
                raise CodegenError(
                    f"ElementwiseKernel: input '{n}' expected a numeric or bool dtype, got {a.dtype}"
                )
        try:
            shape = np.broadcast_shapes(*(a.shape for a in arrays))
        except ValueError:
            got = ", ".join(f"{n}: {a.shape}" for n, a in zip(self.inputs, arrays, strict=True))
            raise CodegenError(
                f"ElementwiseKernel: inputs expected shapes that broadcast together, got {got}"
            ) from None
        return arrays, shape

    def _run(self, views: list[np.ndarray], out2: np.ndarray, R: int, C: int) -> None:
        block = _chunking.BLOCK_ELEMS
        cb = max(1, min(C, block))
        rb = max(1, min(R, block // cb))
        tiled = [row_tile(v, rb, cb, self.compute_dtype) for v in views]
        views = [v if t is None else t for v, t in zip(views, tiled, strict=True)]
        flags = [v.dtype != self.compute_dtype for v in views]
        self._fn(*views, out2, *flags, *(t is not None for t in tiled), R, C, rb, cb)

    def __call__(self, **inputs: Any) -> np.ndarray:
        arrays, shape = self._arrays(inputs)
        if self.reduction is not None:
            return self._reduce(arrays, shape)
        out = np.empty(shape, self.out_dtype)
        if out.size == 0:
            return out
        if self.program is not None and vm_run(self.program, arrays, out):
            return out
        s2 = shape or (1,)
        out2 = out.reshape(math.prod(s2[:-1]), s2[-1])
        self._run([as_rows(a, s2) for a in arrays], out2, *out2.shape)
        return out

    def _target(self, out: Any, inputs: dict[str, Any]) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Checked inputs and ``out`` as a (rows, cols) view this kernel may write directly: None when
        it must compute into a fresh array and copy (a strided ``out``, or one overlapping an input
        other than exactly, which only the VM's tile order makes safe)."""
        arrays, shape = self._arrays(inputs)
        if self.reduction is not None:
            raise CodegenError(
                "ElementwiseKernel.into: a reduction kernel returns its result; call it instead"
            )
        if not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != self.out_dtype:
            got = f"{out.dtype}{list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
            raise CodegenError(
                f"ElementwiseKernel.into: argument 'out' expected a {self.out_dtype}{list(shape)} array "
                f"(the inputs' broadcast shape), got {got}"
            )
        s2 = shape or (1,)
        try:
            out2 = reshape_view(out, (math.prod(s2[:-1]), s2[-1])) if out.flags.writeable else None
        except ValueError:
            out2 = None
        if out2 is not None and out2.strides[1] != out2.itemsize and out2.shape[1] > 1:
            out2 = None
        if out2 is not None and any(np.may_share_memory(out, a) for a in arrays):
            exact = self.program is not None and all(
                not np.may_share_memory(out, a) or (a.shape == out.shape and a.strides == out.strides
                                                    and a.ctypes.data == out.ctypes.data and a.dtype == out.dtype)
                for a in arrays
            )  # fmt: skip
            out2 = out2 if exact else None
        return arrays, out2

    def into(self, out: np.ndarray, inputs: dict[str, Any]) -> np.ndarray:
        """Evaluate into ``out`` (the inputs' broadcast shape, :attr:`out_dtype`); returns ``out``.
        ``out`` may be one of the inputs itself (in place)."""
        arrays, out2 = self._target(out, inputs)
        if out.size == 0:
            return out
        if out2 is None:
            np.copyto(out, self(**inputs))
            return out
        if self.program is not None and out.flags.c_contiguous and vm_run(self.program, arrays, out):
            return out
        self._run([as_rows(a, out.shape or (1,)) for a in arrays], out2, *out2.shape)
        return out

    def bind(self, out: np.ndarray, inputs: dict[str, Any]) -> Callable[[], object]:
        """A zero-argument call doing ``self.into(out, inputs)`` on these very arrays: for the VM, the
        C call with every pointer and stride resolved once (one ctypes call per run; the runtime's arena
        views and initializers are fixed per input shape). Native calls made through it are not counted
        in :func:`opstrata.ops.native_status` (the binding is)."""
        arrays, out2 = self._target(out, inputs)
        if out2 is not None and out.size and self.program is not None and out.flags.c_contiguous:
            call = vm_bind(self.program, arrays, out)
            if call is not None:
                count("codegen", "native")
                return call
        return lambda: self.into(out, inputs)

    def _reduce(self, arrays: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
        op, axis = self.reduction  # type: ignore[misc]
        if axis is None:
            moved = shape or (1,)
        else:
            if not -len(shape) <= axis < len(shape):
                raise CodegenError(f"{op}: argument 'axis' expected an axis in [-{len(shape)}, {len(shape)}) "
                                   f"for inputs broadcasting to {shape}, got {axis}")  # fmt: skip
            moved = (*(d for i, d in enumerate(shape) if i != axis % len(shape)), shape[axis])
        views = [as_rows(np.moveaxis(np.broadcast_to(a, shape), axis, -1) if axis is not None else a, moved)
                 for a in arrays]  # fmt: skip
        R, C = math.prod(moved[:-1]), moved[-1]
        if op == "reduce_max" and (C == 0 or (R * C == 0 and axis is None)):
            raise CodegenError(
                f"{op}: expected a non-empty reduction (max has no identity), got shape {shape}"
            )
        acc = np.full(
            (R,) if axis is not None else (1,), -np.inf if op == "reduce_max" else 0.0, self.compute_dtype
        )
        self._run(views, acc, R, C)
        if op == "reduce_mean":
            with np.errstate(all="ignore"):
                acc /= C * (R if axis is None else 1)
        res = acc.reshape(moved[:-1]) if axis is not None else acc.reshape(())
        return res.astype(self.out_dtype)


_CACHE: dict[tuple[Expr, np.dtype], ElementwiseKernel] = {}
_LOCK = threading.Lock()
_STATS = {"hits": 0, "misses": 0}


def compile_expr(expr: Expr, dtype: Any = "float32") -> ElementwiseKernel:
    """The kernel evaluating ``expr`` in ``dtype``: generated and compiled once per structure, then cached.

    >>> from opstrata.ops.codegen import var
    >>> x = var("x")
    >>> k = compile_expr(x**3 + 1.0)
    >>> "power" in k.source, k(x=np.array([2.0], np.float32)).tolist()
    (False, [9.0])
    """
    if not isinstance(expr, Expr):
        raise CodegenError(f"compile_expr: argument 'expr' expected an Expr, got {type(expr).__name__}")
    try:
        dt = as_dtype(dtype)
    except TypeError:
        dt = None
    if dt not in FLOAT_DTYPES:
        raise CodegenError(f"compile_expr: argument 'dtype' expected a float dtype, got {dtype!r}")
    key = (expr, dt)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _STATS["hits"] += 1
            return hit
        _STATS["misses"] += 1
        kernel = _CACHE[key] = ElementwiseKernel(expr, dt)
        return kernel


def cache_info() -> dict[str, int]:
    """Kernel cache counters: ``hits``, ``misses`` and ``size``."""
    return {**_STATS, "size": len(_CACHE)}


def cache_clear() -> None:
    """Drop every cached kernel and reset the counters."""
    with _LOCK:
        _CACHE.clear()
        _STATS.update(hits=0, misses=0)


assert set(OPS) >= set(_UFUNC)
