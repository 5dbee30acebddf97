"""Float32 expressions as register programs for the native elementwise VM (``opstrata_ew_run_f32``).

A simplified :class:`~.ir.Expr` becomes a short list of instructions over tile registers; the C loop in
``native/kernels.c`` runs the whole program on one L1-sized tile of every row before the next, so a
FusedElementwise node is one C call instead of a Python loop of ufunc calls (numexpr's virtual machine,
here without a compiler in the loop: one prebuilt library serves every expression, so a new expression
costs microseconds to "compile", not a C compiler run). Registers are assigned by liveness as in the
numpy generator; an instruction may overwrite a dying operand (the C loops read index i before writing
it). Math: exp over the full float range, tanh accurate near 0, erf by Eigen's rational form, log and pow
from libm; within a few float32 ulp of numpy's own ufuncs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..native.library import count, library, native_threads
from ..native.packed import NativeCall
from .ir import Expr, kind

__all__ = ["MAX_INPUTS", "MAX_REGISTERS", "VMProgram", "vm_args", "vm_bind", "vm_program", "vm_run"]

#: op name -> the C enum value in kernels.c (``EW_*``, same order)
OPCODES: dict[str, int] = {
    name: i
    for i, name in enumerate(
        ("copy", "add", "sub", "mul", "div", "pow", "maximum", "minimum", "lt", "le", "gt", "ge", "eq",
         "ne", "neg", "abs", "exp", "log", "sqrt", "tanh", "rsqrt", "erf", "sigmoid", "relu", "gelu",
         "gelu_tanh", "silu", "where")
    )
}  # fmt: skip
MAX_REGISTERS = 64  # EW_MAX_REGS in kernels.c
MAX_INPUTS = 32  # EW_MAX_INPUTS

_F32 = np.dtype(np.float32)


@dataclass(frozen=True)
class VMProgram:
    """An instruction array (n x 5 int32: op, dst, a, b, c), the constants and the register count."""

    code: np.ndarray
    consts: np.ndarray
    n_regs: int
    inputs: tuple[str, ...]
    bool_out: bool

    def listing(self) -> str:
        """The program as text, one instruction per line (for ``kernel.source`` and debugging)."""
        names = {v: k for k, v in OPCODES.items()}

        def opd(v: int) -> str:
            if v < 0:
                return self.inputs[-1 - v]
            return f"c{v}={self.consts[v]!r}" if v < len(self.consts) else f"r{v}"

        lines = []
        for op, dst, *args in self.code.tolist():
            name = names.get(op, f"<bad op {op}>")
            n = 3 if name == "where" else 1 if name in _UNARY else 2
            lines.append(f"r{dst} = {name}({', '.join(opd(a) for a in args[:n])})")
        return "\n".join(lines)


_UNARY = frozenset({"copy", "neg", "abs", "exp", "log", "sqrt", "tanh", "rsqrt", "erf", "sigmoid", "relu",
                    "gelu", "gelu_tanh", "silu"})  # fmt: skip


def vm_program(expr: Expr, inputs: list[str]) -> VMProgram | None:
    """The program for the (simplified, reduction-free) ``expr``; None when the VM cannot run it
    (an op it lacks, more registers or inputs than it holds)."""
    if len(inputs) > MAX_INPUTS:
        return None
    order: list[Expr] = []
    seen: set[Expr] = set()
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    consts: dict[float, int] = {}
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n in seen:
            continue
        seen.add(n)
        if n.op == "const":
            consts.setdefault(n.value, len(consts))
            continue
        if n.op == "var":
            continue
        if n.op != "to_float" and n.op not in OPCODES:
            return None
        stack.append((n, True))
        stack.extend((a, False) for a in reversed(n.args))
    slot = {name: -1 - i for i, name in enumerate(inputs)}
    reg: dict[Expr, int] = {}
    last = {a: k for k, n in enumerate(order) for a in n.args}
    free: list[int] = []
    n_regs = len(consts)
    code: list[tuple[int, int, int, int, int]] = []

    def operand(e: Expr) -> int:
        if e.op == "var":
            return slot[e.attr]
        if e.op == "const":
            return consts[e.value]
        return reg[e]

    for k, n in enumerate(order):
        args = [operand(a) for a in n.args]
        dying = [a for a in dict.fromkeys(n.args) if a in reg and last[a] == k]
        if dying:
            dst = reg[dying.pop(0)]
        elif free:
            dst = free.pop()
        else:
            dst, n_regs = n_regs, n_regs + 1
        free += [reg[a] for a in dying]
        reg[n] = dst
        op = "copy" if n.op == "to_float" else n.op
        code.append((OPCODES[op], dst, *[*args, 0, 0, 0][:3]))  # type: ignore[arg-type]
    if expr.op in ("var", "const"):  # a leaf root: copy it into a register
        code.append((OPCODES["copy"], n_regs, operand(expr), 0, 0))
        n_regs += 1
    if n_regs > MAX_REGISTERS:
        return None
    const_values = np.array(sorted(consts, key=consts.__getitem__), dtype=_F32)
    return VMProgram(
        np.ascontiguousarray(code, dtype=np.int32).reshape(-1, 5),
        const_values,
        n_regs,
        tuple(inputs),
        kind(expr) == "b",
    )


RDIMS = 4  # EW_MAX_RDIMS in kernels.c: row dimensions after coalescing


def _elem_strides(a: np.ndarray, shape: tuple[int, ...]) -> list[int] | None:
    """``a``'s strides in elements once broadcast to ``shape`` (0 on broadcast dims); None when a
    stride is not a whole number of elements."""
    pad = len(shape) - a.ndim
    out = [0] * pad
    for d, st in zip(a.shape, a.strides, strict=True):
        if d == 1:
            out.append(0)
        elif st % 4:
            return None
        else:
            out.append(st // 4)
    return out


def _coalesce(shape: tuple[int, ...], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop unit dims and merge neighbours every operand walks contiguously (numpy's nditer coalescing);
    the output (C-contiguous) is the last operand."""
    keep = [i for i, d in enumerate(shape) if d != 1]
    dims = [shape[i] for i in keep]
    st = [[s[i] for i in keep] for s in strides]
    i = len(dims) - 2
    while i >= 0:
        if all(s[i] == s[i + 1] * dims[i + 1] for s in st):
            dims[i] *= dims[i + 1]
            for s in st:
                s[i] = s[i + 1]
                del s[i + 1]
            del dims[i + 1]
        i -= 1
    return dims, st


def _layout(
    arrays: list[np.ndarray], shape: tuple[int, ...]
) -> tuple[list[np.ndarray], list[int], list[list[int]], bool]:
    """Inputs as float32 operands over ``shape`` with coalesced dims: (operands, dims, strides per
    operand with the output's last, copied) -- ``copied`` when an operand had to be converted or laid
    out afresh (a dtype other than float32, a column stride other than 0 / 1, too many row dims)."""
    shape = shape or (1,)
    ops_: list[np.ndarray] = []
    copied = False
    for a in arrays:
        if a.dtype != _F32 or _elem_strides(a, shape) is None:
            a = np.ascontiguousarray(a, dtype=_F32)
            copied = True
        ops_.append(a)
    out_st = [int(np.prod(shape[i + 1 :])) for i in range(len(shape))]
    for _attempt in range(3):
        strides = [_elem_strides(a, shape) for a in ops_]
        dims, st = _coalesce(shape, [*strides, out_st])  # type: ignore[list-item]
        if not dims:
            dims, st = [1], [[0] for _ in st]
            st[-1] = [1]
        bad = [k for k, s in enumerate(st[:-1]) if s[-1] not in (0, 1)]
        if len(dims) - 1 > RDIMS:
            bad = [k for k, s in enumerate(st[:-1]) if any(s)]  # lay every non-scalar input out in full
        if not bad:
            return ops_, dims, st, copied
        for k in bad:
            ops_[k] = np.ascontiguousarray(np.broadcast_to(ops_[k], shape))
        copied = True
    raise AssertionError("unreachable: full operands always coalesce")  # pragma: no cover


def vm_args(
    prog: VMProgram, arrays: list[np.ndarray], out: np.ndarray
) -> tuple[tuple[int, ...], list[Any], bool]:
    """The C call's arguments for ``prog`` on ``arrays`` (broadcasting to ``out.shape``) into the
    C-contiguous ``out`` (float32 or bool), the arrays they point into (keep them alive while the
    arguments are used) and whether an input was copied to get there."""
    operands, dims, st, copied = _layout(arrays, out.shape)
    cols = dims[-1]
    rdims = [1] * (RDIMS + 1 - len(dims)) + dims[:-1]
    rstr = np.array([[0] * (RDIMS + 1 - len(dims)) + s[:-1] for s in st[:-1]], dtype=np.int64).reshape(
        -1, RDIMS
    )
    cstr = np.array([s[-1] for s in st[:-1]], dtype=np.int64)
    ptrs = np.array([a.ctypes.data for a in operands], dtype=np.uintp)
    rd = np.array(rdims, dtype=np.int64)
    keep: list[Any] = [*operands, ptrs, rstr, cstr, rd, prog.code, prog.consts, out]
    args = (
        prog.code.ctypes.data, len(prog.code), prog.consts.ctypes.data, len(prog.consts), prog.n_regs,
        ptrs.ctypes.data, rstr.ctypes.data, cstr.ctypes.data, len(operands), out.ctypes.data, cols,
        int(prog.bool_out), rd.ctypes.data, cols, native_threads(),
    )  # fmt: skip
    return args, keep, copied


def _rejected(prog: VMProgram, rc: int) -> RuntimeError:
    return RuntimeError(
        f"opstrata_ew_run_f32: native elementwise program rejected (code {rc}); program:\n{prog.listing()}"
    )


def vm_run(prog: VMProgram, arrays: list[np.ndarray], out: np.ndarray) -> bool:
    """Run ``prog`` on ``arrays`` (broadcasting to ``out.shape``) into the C-contiguous ``out`` (float32
    or bool); False when the native library is not available (the caller runs its numpy kernel)."""
    lib = library()
    if lib is None:
        count("codegen", "numpy")
        return False
    args, _keep, _ = vm_args(prog, arrays, out)
    rc = lib.opstrata_ew_run_f32(*args)
    if rc != 0:
        raise _rejected(prog, rc)
    count("codegen", "native")
    return True


def vm_bind(prog: VMProgram, arrays: list[np.ndarray], out: np.ndarray) -> Callable[[], None] | None:
    """A zero-argument call running ``prog`` on these very arrays (pointers resolved once: the runtime's
    arena views are fixed per input shape); None when the native library is not available or an input
    had to be copied (converted or laid out afresh), which would freeze its current values into the call."""
    lib = library()
    if lib is None:
        return None
    args, keep, copied = vm_args(prog, arrays, out)
    if copied:
        return None
    return NativeCall(lib, "opstrata_ew_run_f32", args, keep, lambda rc: _rejected(prog, rc))
