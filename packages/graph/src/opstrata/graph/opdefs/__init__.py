"""The IR's op vocabulary: one place per op for its ONNX import, shape rule, executor kernel and classes.

``registry.py`` holds :class:`~.registry.OpDef` and the tables every other part of the compiler reads;
each family module (``elementwise.py``, ``conv.py``, ...) defines its ops: one row for a simple op, a
few functions beside the row for an op with its own logic. ``families.py`` imports every family; the
drivers (import, shape inference, executor, plan) import it, so the tables are full before use.
"""
