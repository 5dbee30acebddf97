"""Side-by-side timing for benchmarks: interleaved A/B runs, alternating order, medians and ratios.

A shared 2-core machine makes absolute times noise; a ratio of medians measured in the same run,
with the candidates interleaved so drift hits both alike, is the figure worth reporting.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Timing", "compare", "conv_peers", "format_table"]


@dataclass(frozen=True)
class Timing:
    """Median and all samples (seconds) of one candidate."""

    name: str
    median: float
    samples: tuple[float, ...]


def _time_once(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def compare(
    candidates: dict[str, Callable[[], object]],
    *,
    repeats: int = 7,
    number: int = 1,
    warmup: int = 1,
    settle_s: float = 0.0,
    warm_s: float = 0.0,
) -> dict[str, Timing]:
    """Time each candidate ``repeats`` times, rotating which goes first each round; return medians.

    With ``settle_s`` / ``warm_s`` each timed turn first waits ``settle_s`` and then runs its candidate
    untimed for ``warm_s`` seconds: a multi-threaded runtime whose idle workers spin after a call
    (onnxruntime's, ~25 ms) then cannot hold a core through the next candidate's turn, and each is timed
    at its steady state (what the zoo's ``--bench`` does)."""
    names = list(candidates)
    for name in names:
        for _ in range(warmup):
            candidates[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if settle_s > 0:
                time.sleep(settle_s)
            until = time.perf_counter() + warm_s
            while time.perf_counter() < until:
                candidates[name]()
            samples[name].append(_time_once(candidates[name], number))
    return {n: Timing(n, statistics.median(s), tuple(s)) for n, s in samples.items()}


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table (benchmarks print it; docs/benchmarks.md keeps it)."""
    cells = [[str(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def conv_peers(
    x: Any, w: Any, b: Any, *, stride: int, pad: int, groups: int = 1, threads: int = 1
) -> dict[str, Callable[[], object]]:
    """The same 2-D convolution (float32 NCHW, square stride and padding) as onnxruntime and torch eager
    candidates for :func:`compare`, each at ``threads`` threads; a peer that is not installed is left out.
    onnxruntime's pool does not spin, so it cannot hold a core through the next candidate's turn."""
    peers: dict[str, Callable[[], object]] = {}
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        pass
    else:
        node = helper.make_node(
            "Conv", ["x", "w", "b"], ["y"], group=groups, pads=[pad] * 4, strides=[stride] * 2
        )
        graph = helper.make_graph(
            [node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
        )  # fmt: skip
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        peers["onnxruntime"] = lambda: sess.run(None, {"x": x})
    try:
        import torch
    except ImportError:
        return peers
    torch.set_num_threads(threads)
    tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))
    conv = torch.nn.functional.conv2d
    peers["torch"] = lambda: conv(tx, tw, tb, stride=stride, padding=pad, groups=groups)
    return peers
