"""One place per op: every fact the compiler knows about an IR op, registered once and read by everyone.

An :class:`OpDef` holds an op's ONNX import (attribute defaults, or an importer function for ops with
their own logic), its shape rule, its executor kernel, the opstrata.ops kernels that kernel calls
(what a Plan binds and audits), its elementwise class (fusion, tensor-parallel partitioning) and its
code-generator expression. The importer, shape inference, executor, plan binder, fusion passes,
partitioner and docs read the derived tables below (:data:`IMPORTERS`, :data:`RULES`,
:data:`KERNELS`, :data:`USES`); none of them names an op itself. onnx's reference evaluator keeps
one op per file the same way; simple ops are one row each (see ``elementwise.py``).

>>> d = define("MyRelu", domain="example", kernel=lambda n, x: [x[0].clip(0)], uses=("host",))
>>> KERNELS[("example", "MyRelu")] is d.kernel
True
>>> undefine("MyRelu", "example")
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFS",
    "ELEMENTWISE_CLASSES",
    "HOST",
    "IMPORTERS",
    "KERNELS",
    "RULES",
    "USES",
    "OpDef",
    "define",
    "elementwise_ops",
    "lookup",
    "op_defs",
    "undefine",
]

#: ``uses`` entry of an op whose executor kernel is host numpy code (shape metadata, rare ops).
HOST = "host"
#: Elementwise classes: ``unary``/``binary`` ops may join a FusedElementwise chain (with a codegen
#: name); every classed op follows a tensor-parallel split of its inputs.
ELEMENTWISE_CLASSES = ("unary", "binary", "variadic", "other")
#: Tensor-parallel layout rules (partition/rules.py): how a split input flows through the op.
#: Elementwise ops follow the "elementwise" rule without naming it; other ops name theirs in ``layout``.
LAYOUT_CLASSES = (
    "elementwise", "transpose", "unsqueeze", "squeeze", "softmax", "norm", "reduce", "split", "reshape",
    "expand", "matmul", "attention", "shape",
)  # fmt: skip

Importer = Callable[[Any], None]  # (ImportContext) -> None
Rule = Callable[[Any, Any], list]  # (Node, RuleContext) -> [(dtype, shape), ...]
Kernel = Callable[[Any, list], list]  # (Node, [arrays]) -> [arrays]


def _key(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


@dataclass(eq=False)
class OpDef:
    """The facts of one IR op (``domain`` "" is ONNX's default domain)."""

    name: str
    domain: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict)  # ONNX attributes -> defaults (importer fills)
    importer: Importer | None = None  # ONNX node -> IR nodes; None: pass through with ``attrs`` defaults
    shape: Rule | None = None  # shape/dtype rule of the IR op
    kernel: Kernel | None = None  # executor function of the IR op
    uses: tuple[str, ...] = ()  # opstrata.ops kernels the executor calls; (HOST,) host code; () none
    elementwise: str | None = None  # one of ELEMENTWISE_CLASSES, or None
    codegen: str | None = None  # opstrata.ops.codegen function of a fusable unary/binary op
    onnx: bool = True  # the ONNX op of this name imports (default domain only)
    inplace: bool = False  # the output may take the buffer of an input that dies here (same shape, itemsize)
    view: bool = False  # the cpu kernel returns input 0's bytes with a new shape (memory plan: one buffer)
    nondeterministic: bool = False  # outputs differ run to run (random ops): never folded nor merged by CSE
    layout: str | None = None  # tensor-parallel layout rule (LAYOUT_CLASSES); None: partition stops here
    dtypes: str = ""  # the dtypes the kernel takes, for docs ("float", "numeric", "all", ...)
    dispatch_input: int | None = None  # the input whose dtype picks the ops kernel; None: the first float one
    doc: str = ""  # one line for docs/ir-ops.md
    module: str = ""  # the module that defined the op (set by define)

    @property
    def layout_rule(self) -> str | None:
        """The partition rule a split input follows here: ``layout``, else "elementwise" for elementwise ops."""
        return self.layout or ("elementwise" if self.elementwise else None)

    @property
    def qualified(self) -> str:
        """``Conv`` for the ONNX domain, ``ai.opstrata::Linear`` otherwise."""
        return self.name if not self.domain else f"{self.domain}::{self.name}"

    # decorators that fill a field after the row is defined (ops with their own logic)
    def imports(self, fn: Importer) -> Importer:
        """Decorator: ``fn(ctx)`` imports the ONNX node of this op."""
        self.importer = fn
        _publish(self)
        return fn

    def infers(self, fn: Rule) -> Rule:
        """Decorator: ``fn(node, ctx)`` is this op's shape/dtype rule."""
        self.shape = fn
        _publish(self)
        return fn

    def runs(self, fn: Kernel) -> Kernel:
        """Decorator: ``fn(node, inputs)`` is this op's executor kernel."""
        self.kernel = fn
        _publish(self)
        return fn


#: (domain, name) -> OpDef
DEFS: dict[tuple[str, str], OpDef] = {}
#: ONNX op type (default domain) -> importer (a passthrough for rows without one); filled by ``onnx/``
IMPORTERS: dict[str, Importer] = {}
#: (domain, name) -> shape rule
RULES: dict[tuple[str, str], Rule] = {}
#: (domain, name) -> executor kernel
KERNELS: dict[tuple[str, str], Kernel] = {}
#: qualified name -> space-separated opstrata.ops kernels (or "host") the executor calls
USES: dict[str, str] = {}

_PASSTHROUGH: list[Callable[[Mapping[str, Any]], Importer]] = []  # set by onnx.context (no import cycle)


def _publish(d: OpDef) -> None:
    key = (d.domain, d.name)
    if d.onnx and not d.domain:
        if d.importer is not None:
            IMPORTERS[d.name] = d.importer
        elif _PASSTHROUGH:
            IMPORTERS[d.name] = _PASSTHROUGH[0](d.attrs)
    if d.shape is not None:
        RULES[key] = d.shape
    if d.kernel is not None:
        KERNELS[key] = d.kernel
    if d.kernel is not None or d.uses:
        USES[d.qualified] = " ".join(d.uses)


def define(name: str, domain: str = "", **facts: Any) -> OpDef:
    """Register (or replace) the OpDef of ``name`` in ``domain`` and publish it to the derived tables."""
    domain = _key(domain)
    if facts.get("elementwise") not in (None, *ELEMENTWISE_CLASSES):
        raise ValueError(
            f"define({name!r}): elementwise={facts['elementwise']!r}; use one of {ELEMENTWISE_CLASSES}"
        )
    if facts.get("layout") not in (None, *LAYOUT_CLASSES):
        raise ValueError(f"define({name!r}): layout={facts['layout']!r}; use one of {LAYOUT_CLASSES}")
    facts.setdefault("module", sys._getframe(1).f_globals.get("__name__", ""))
    undefine(name, domain)
    d = OpDef(name, domain, **facts)
    DEFS[(domain, name)] = d
    _publish(d)
    return d


def undefine(name: str, domain: str = "") -> None:
    """Remove an op from the registry and every derived table (tests, plugins)."""
    domain = _key(domain)
    d = DEFS.pop((domain, name), None)
    if d is None:
        return
    if not domain and IMPORTERS.get(name) is not None and d.onnx:
        IMPORTERS.pop(name, None)
    RULES.pop((domain, name), None)
    KERNELS.pop((domain, name), None)
    USES.pop(d.qualified, None)


def lookup(name: str, domain: str = "") -> OpDef | None:
    """The OpDef of ``name`` in ``domain`` (``ai.onnx`` and ``""`` are the same), else None."""
    return DEFS.get((_key(domain), name))


def op_defs() -> list[OpDef]:
    """Every registered OpDef, sorted by qualified name (docs, coverage tables)."""
    return sorted(DEFS.values(), key=lambda d: d.qualified)


def elementwise_ops(*classes: str, codegen: bool = False) -> frozenset[str]:
    """Qualified names of the ops in the given elementwise classes (all classes when none given);
    ``codegen=True`` keeps only those the FusedElementwise generator can emit."""
    want = set(classes or ELEMENTWISE_CLASSES)
    return frozenset(
        d.qualified for d in DEFS.values() if d.elementwise in want and (not codegen or d.codegen is not None)
    )
