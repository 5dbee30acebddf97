"""Shared fixtures: the graph issue's test models with their feeds."""

from __future__ import annotations

import pytest

from opstrata.graph.testing import bert_block_model, cnn_model, gpt_block_model, mlp_model

MODELS = {
    "mlp": (mlp_model, {"batch": 4}),
    "cnn": (cnn_model, {"batch": 2}),
    "bert": (bert_block_model, {"batch": 2, "seq": 5}),
    "gpt": (gpt_block_model, {"batch": 2, "seq": 5}),
}


@pytest.fixture(scope="session")
def models() -> dict:
    """name -> (ModelProto, dims), built once per test session."""
    pytest.importorskip("onnx")
    return {name: (build(), dims) for name, (build, dims) in MODELS.items()}
