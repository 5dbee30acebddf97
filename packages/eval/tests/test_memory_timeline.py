"""The arena memory timeline: `opstrata run --memory` and its `opstrata report` section."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

onnx = pytest.importorskip("onnx")

import opstrata.runtime as rt  # noqa: E402
from opstrata.eval import _cli, build_report  # noqa: E402
from opstrata.eval._memory_timeline import MEMORY_KIND, memory_timeline  # noqa: E402
from opstrata.graph.testing import bert_block_model, cnn_model, gpt_block_model, mlp_model, random_feeds  # noqa: E402

MODELS = {
    "mlp": (mlp_model, lambda b, s: {"batch": b}),
    "gpt": (gpt_block_model, lambda b, s: {"batch": b, "seq": s}),
    "bert": (bert_block_model, lambda b, s: {"batch": b, "seq": s}),
    "cnn": (cnn_model, lambda b, s: {"batch": b}),
}


def _plan(name: str, batch: int, seq: int):
    build, dims = MODELS[name]
    model = build()
    sess = rt.InferenceSession(model)
    feeds = random_feeds(model, dims(batch, seq))
    sess.run(None, feeds)
    plan = sess.plan.memory_for({k: v.shape for k, v in feeds.items()}, dynamic=True)
    return plan, sess.plan.graph


def _union_bytes(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) byte ranges: what is occupied, however values share buffers."""
    total, reach = 0, 0
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(sorted(MODELS)), batch=st.integers(1, 4), seq=st.integers(1, 9))
def test_timeline_matches_a_per_step_union_of_live_ranges(name: str, batch: int, seq: int) -> None:
    plan, graph = _plan(name, batch, seq)
    doc = memory_timeline(plan, graph)
    steps = doc["steps"]
    assert len(steps) == len(graph.nodes) + 1 and doc["kind"] == MEMORY_KIND
    for i, row in enumerate(steps):
        ranges = [(plan.offsets[v], plan.offsets[v] + plan.sizes[v])
                  for v, (first, last) in plan.lifetimes.items() if first <= i <= last]  # fmt: skip
        assert row["live_bytes"] == _union_bytes(ranges), (name, i)
        assert row["extent_bytes"] == max((end for _, end in ranges), default=0), (name, i)
        assert row["live_bytes"] <= row["extent_bytes"] <= plan.arena_bytes
    assert max(r["live_bytes"] for r in steps) == plan.lower_bound_bytes
    assert [r["node"] for r in steps[:-1]] == [n.name or f"#{k}" for k, n in enumerate(graph.nodes)]


def _svgs(html: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg.*?</svg>", html, re.S)]


def test_run_writes_the_timeline_and_report_plots_it(tmp_path: Path, capsys) -> None:
    onnx.save(gpt_block_model(), tmp_path / "gpt.onnx")
    out = tmp_path / "mem.json"
    argv = ["run", str(tmp_path / "gpt.onnx"), "--random", "--dim", "batch=2", "--dim", "seq=8", "--repeat", "1",
            "--memory", str(out)]  # fmt: skip
    assert _cli.main(argv) == 0
    assert "== memory" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    plan, graph = _plan("gpt", 2, 8)
    assert doc == json.loads(json.dumps(memory_timeline(plan, graph)))
    html_path, md_path = build_report([out], tmp_path / "r.html")
    (chart,) = _svgs(html_path.read_text())
    assert chart.get("data-kind") == "line" and int(chart.get("data-points")) == len(doc["steps"])
    md = md_path.read_text()
    assert "arena memory timeline: gpt_block" in md
    assert f"arena {doc['arena_bytes'] / 1024:.1f} KiB" in md
    peak = max(doc["steps"], key=lambda r: r["live_bytes"])
    assert f"| {peak['step']} | {peak['node']} | {peak['op']} | {peak['live_bytes'] / 1024:.1f} |" in md


def test_memory_to_an_unwritable_path_is_one_line(tmp_path: Path, capsys) -> None:
    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = [
        "run",
        str(tmp_path / "mlp.onnx"),
        "--random",
        "--repeat",
        "0",
        "--memory",
        str(blocker / "m.json"),
    ]
    assert _cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("opstrata run: error: --memory: cannot write") and "\n" not in err


def test_a_timeline_missing_a_field_is_a_report_error(tmp_path: Path) -> None:
    from opstrata.eval import ReportError

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": MEMORY_KIND, "graph": "g", "steps": []}))
    with pytest.raises(ReportError, match=r"bad\.json: looks like a results file but a field is missing"):
        build_report([bad], tmp_path / "r.html")
