"""Detection ops of the ONNX operator specification: NonMaxSuppression.

Greedy per (batch, class) suppression as the spec and onnxruntime do it: candidates above the score
threshold (when one is given) in score order (ties: lower box index first), a box is dropped when its
IoU with an already selected box exceeds ``iou_threshold``; boxes are ``[y1, x1, y2, x2]`` in any corner
order (``center_point_box=0``) or ``[x_center, y_center, width, height]`` (``1``). The output size
depends on the data (the runtime allocates it per run); the executor kernel is host numpy code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._ir import Node
from .._shape_rules import RuleContext, TypeShape
from .common import Arr
from .registry import HOST, define

__all__ = ["non_max_suppression"]


def _corners(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """(ymin, xmin, ymax, xmax) of every box, in the boxes' dtype."""
    if center_point_box:
        xc, yc, w, h = (boxes[..., i] for i in range(4))
        return yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
    y1, x1, y2, x2 = (boxes[..., i] for i in range(4))
    return np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)


def _suppressed(c: tuple[np.ndarray, ...], area: np.ndarray, i: int, sel: list[int], iou: Any) -> bool:
    """True when box ``i`` overlaps a selected box by IoU > ``iou`` (degenerate boxes never suppress)."""
    if not sel:
        return False
    s = np.asarray(sel)
    ymin, xmin, ymax, xmax = c
    ih = np.minimum(ymax[i], ymax[s]) - np.maximum(ymin[i], ymin[s])
    iw = np.minimum(xmax[i], xmax[s]) - np.maximum(xmin[i], xmin[s])
    inter = ih * iw
    union = area[i] + area[s] - inter
    ok = (ih > 0) & (iw > 0) & (inter > 0) & (area[i] > 0) & (area[s] > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return bool(np.any(ok & (inter / np.where(ok, union, 1) > iou)))


def non_max_suppression(
    boxes: Arr,
    scores: Arr,
    max_output_boxes_per_class: int = 0,
    iou_threshold: float = 0.0,
    score_threshold: float | None = None,
    center_point_box: int = 0,
) -> Arr:
    """Selected ``[batch, class, box]`` index triples (int64, (n, 3)) of ONNX NonMaxSuppression."""
    boxes, scores = np.asarray(boxes), np.asarray(scores)
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0]:
        raise ValueError(
            f"NonMaxSuppression: boxes must be (batch, boxes, 4) and scores (batch, classes, boxes), got "
            f"{boxes.shape} and {scores.shape}"
        )
    if scores.shape[2] != boxes.shape[1]:
        raise ValueError(
            f"NonMaxSuppression: {boxes.shape[1]} boxes but scores {scores.shape} score {scores.shape[2]}"
        )
    out: list[tuple[int, int, int]] = []
    limit = max(int(max_output_boxes_per_class), 0)
    iou = boxes.dtype.type(iou_threshold)
    for b in range(boxes.shape[0]):
        c = _corners(boxes[b], center_point_box)
        area = (c[2] - c[0]) * (c[3] - c[1])
        for k in range(scores.shape[1]):
            sc = scores[b, k]
            idx = np.arange(sc.shape[0])
            if score_threshold is not None:
                idx = idx[sc > sc.dtype.type(score_threshold)]
            order = idx[np.lexsort((idx, -sc[idx].astype(np.float64)))]
            sel: list[int] = []
            for i in order:
                if len(sel) >= limit:
                    break
                if not _suppressed(c, area, int(i), sel, iou):
                    sel.append(int(i))
                    out.append((b, k, int(i)))
    return np.array(out, np.int64).reshape(-1, 3)


def _nms_rule(n: Node, ctx: RuleContext) -> list[TypeShape]:
    ctx.need_dtype(0, "f", "a floating tensor")
    return [(np.dtype(np.int64), (None, 3))]


def _scalar(x: list[Any], i: int) -> Any:
    if i >= len(x) or x[i] is None or np.asarray(x[i]).size == 0:
        return None
    return np.asarray(x[i]).ravel()[0]


def _run_nms(n: Node, x: list[Arr]) -> list[Arr]:
    limit, iou, score = _scalar(x, 2), _scalar(x, 3), _scalar(x, 4)
    return [
        non_max_suppression(
            x[0], x[1], 0 if limit is None else int(limit), 0.0 if iou is None else float(iou), score,
            int(n.attrs.get("center_point_box", 0)),
        )
    ]  # fmt: skip


define(
    "NonMaxSuppression", attrs={"center_point_box": 0}, shape=_nms_rule, kernel=_run_nms, uses=(HOST,),
    dtypes="float", doc="output size depends on the data (allocated per run)",
)  # fmt: skip
