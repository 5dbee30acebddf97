"""The IR's op vocabulary: one place per op for its ONNX import, shape rule, executor kernel and classes (see registry.py)."""
