"""`opstrata report` on a quantization report: SQNR per layer as bars, the nodes and the budget as text."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")

import opstrata.quant as oq  # noqa: E402
from opstrata.eval import ReportError, build_report  # noqa: E402
from opstrata.graph.testing import mlp_model, random_feeds  # noqa: E402


def _svgs(html: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg.*?</svg>", html, re.S)]


@pytest.fixture(scope="module")
def quantized_report() -> dict:
    model = mlp_model()
    calib = [random_feeds(model, {"batch": 8}, seed=s) for s in range(3)]
    return oq.quantize(model, calib, "w8a8").report.to_dict()


def test_quant_section_plots_each_measured_nodes_sqnr(quantized_report, tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    path.write_text(json.dumps(quantized_report))
    html_path, md_path = build_report([path], tmp_path / "r.html")
    (chart,) = _svgs(html_path.read_text())
    nodes = quantized_report["nodes"]
    assert chart.get("data-kind") == "bar" and int(chart.get("data-points")) == len(nodes) > 0
    titles = [t.text for t in chart.iter("{http://www.w3.org/2000/svg}title")]
    for n, title in zip(nodes, titles, strict=True):
        assert title == f"{n['node']}: {float(n['sqnr_db']):.4g} dB"
    md = md_path.read_text()
    assert f"## quantization: scheme {quantized_report['scheme']}" in md
    for n in nodes:
        assert f"| {n['node']} | {n['op']} | {float(n['sqnr_db']):.1f} | {float(n['cosine']):.6f} |" in md
    out = quantized_report["outputs"][0]
    assert f"output '{out['name']}': cosine {float(out['cosine']):.6f}" in md


def test_budget_fallback_perplexity_and_unmeasured_nodes_are_shown(tmp_path: Path) -> None:
    doc = {
        "kind": "quant", "scheme": "w8a8-dynamic", "fallback": ["fc2"], "budget": {"min_cosine": 0.999},
        "budget_met": True, "size_bytes": {"float": 4 << 20, "quantized": 1 << 20},
        "perplexity": {"float": 12.5, "quantized": 12.75, "delta": 0.25},
        "outputs": [{"name": "logits", "cosine": 0.9995, "sqnr_db": 30.0, "max_abs": 0.1, "top1_agreement": None}],
        "nodes": [
            {"node": "fc1", "op": "MatMul", "sqnr_db": 35.0, "cosine": 0.9999, "kept_float": False, "reason": "",
             "local_sqnr_db": 40.0, "local_cosine": 0.99999, "max_abs": 0.01},
            {"node": "fc2", "op": "MatMul", "sqnr_db": "inf", "cosine": 1.0, "kept_float": True,
             "reason": "budget: SQNR 12.0 dB, the worst", "local_sqnr_db": None, "local_cosine": None,
             "max_abs": 0.0},
            {"node": "fc3", "op": "Gemm", "sqnr_db": None, "cosine": None, "kept_float": False, "reason": "",
             "local_sqnr_db": None, "local_cosine": None, "max_abs": None},
        ],
    }  # fmt: skip
    path = tmp_path / "q.json"
    path.write_text(json.dumps(doc))
    html_path, md_path = build_report([path], tmp_path / "r.html")
    (chart,) = _svgs(html_path.read_text())
    assert int(chart.get("data-points")) == 2  # fc3 was not measured: no bar, a dash in the table
    md = md_path.read_text()
    assert "weights 4.00 MiB -> 1.00 MiB (x4.00 smaller)" in md
    assert "perplexity 12.5000 -> 12.7500 (delta +0.2500)" in md
    assert "accuracy budget {'min_cosine': 0.999}: met; put back to float: ['fc2']" in md
    assert "| fc2 | MatMul | inf | 1.000000 | - | budget: SQNR 12.0 dB, the worst |" in md
    assert "| fc3 | Gemm | - | - | - |  |" in md


def test_a_quant_report_missing_its_sizes_is_a_report_error(quantized_report, tmp_path: Path) -> None:
    bad = {k: v for k, v in quantized_report.items() if k != "size_bytes"}
    path = tmp_path / "q.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ReportError, match=r"q\.json: looks like a results file but a field is missing"):
        build_report([path], tmp_path / "r.html")
