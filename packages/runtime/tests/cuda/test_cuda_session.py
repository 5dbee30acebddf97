"""Sessions on the cuda device (a GPU): outputs equal the cpu session's, device feeds and outputs stay there.

Skipped where CuPy or a GPU is missing (CI, the development machines); run by ``tools/gpu_check.sh``.
"""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.ops as ops
from opstrata.graph.testing import (
    bert_block_model,
    cnn_model,
    gpt_block_model,
    gpt_gqa_model,
    mlp_model,
    random_feeds,
)
from opstrata.runtime import InferenceSession

pytestmark = pytest.mark.skipif("cuda" not in ops.list_devices(), reason="no cuda device here")
cp = pytest.importorskip("cupy") if "cuda" in ops.list_devices() else None

MODELS = {
    "mlp": (mlp_model, {"batch": 8}),
    "cnn": (cnn_model, {"batch": 4}),
    "bert": (bert_block_model, {"batch": 4, "seq": 33}),
    "gpt": (gpt_block_model, {"batch": 2, "seq": 17}),
    "gqa": (gpt_gqa_model, {"batch": 2, "seq": 9}),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_session_equals_cpu(name):
    build, dims = MODELS[name]
    model = build()
    feeds = random_feeds(model, dims)
    with ops.fallback_policy("allow"):
        sess = InferenceSession(model, device="cuda")
        got = sess.run(None, feeds)
    want = InferenceSession(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, np.ndarray) and g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=name)


def test_run_on_device_and_providers():
    model = mlp_model()
    feeds = random_feeds(model, {"batch": 3})
    sess = InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.device == "cuda" and sess.device_fallbacks() == []
    (out,) = sess.run_on_device(None, {k: cp.asarray(v) for k, v in feeds.items()})
    assert isinstance(out, cp.ndarray)
    np.testing.assert_allclose(
        cp.asnumpy(out), InferenceSession(model).run(None, feeds)[0], rtol=1e-4, atol=1e-5
    )
