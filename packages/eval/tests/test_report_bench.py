"""`opstrata report` on bench models/zoo/comm JSON: latency against peers, comm bus bandwidth per size."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from opstrata.eval import ReportError, _cli, build_report
from opstrata.eval._report import load_section

SVG = "{http://www.w3.org/2000/svg}"

MODELS = {
    "suite": "models", "baseline": "base", "rounds": 5, "notes": ["a note"], "fingerprint_differences": [],
    "rows": [
        {"bench": "gpt_block/opstrata", "median_s": 2e-3, "rounds": 5, "model": "gpt_block", "threads": 1,
         "runtime": "opstrata", "peer": "gpt_block/onnxruntime", "peer_median_s": 1e-3, "peer_ratio": 2.125,
         "peer_ci": [1.9, 2.3], "baseline_median_s": 2e-3, "ratio": 1.01, "ci": [0.98, 1.03], "verdict": "same"},
        {"bench": "gpt_block/onnxruntime", "median_s": 1e-3, "rounds": 5, "model": "gpt_block", "threads": 1,
         "runtime": "onnxruntime", "peer_of": "gpt_block/opstrata"},
        {"bench": "mlp/opstrata", "median_s": 4e-4, "rounds": 5, "model": "mlp", "threads": 1,
         "runtime": "opstrata", "peer": "mlp/onnxruntime", "peer_median_s": 5e-4, "peer_ratio": 0.8125,
         "peer_ci": [0.7, 0.9]},
        {"bench": "mlp/onnxruntime", "median_s": 5e-4, "rounds": 5, "model": "mlp", "threads": 1,
         "runtime": "onnxruntime", "peer_of": "mlp/opstrata"},
    ],
}  # fmt: skip

COMM = {
    "suite": "comm", "baseline": None, "rounds": 5, "notes": [], "fingerprint_differences": [],
    "rows": [  # out of size order on purpose: the chart goes by size
        {"bench": f"all_reduce/{label}", "median_s": t, "rounds": 5, "op": "all_reduce", "bytes": n, "ranks": 2,
         "busbw_GBps": n / t / 1e9, "algbw_GBps": n / t / 1e9}
        for label, n, t in (("1MiB", 1 << 20, 5e-4), ("4KiB", 4096, 2e-5), ("64KiB", 65536, 6e-5))
    ],
}  # fmt: skip


def _svgs(html: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg.*?</svg>", html, re.S)]


def _write(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def test_peer_latency_section_plots_the_ratios(tmp_path) -> None:
    html_path, md_path = build_report([_write(tmp_path, "models", MODELS)], tmp_path / "r.html")
    (chart,) = _svgs(html_path.read_text())
    assert (chart.get("data-kind"), chart.get("data-points")) == ("bar", "2")  # one bar per model with a peer
    titles = [t.text for t in chart.findall(f".//{SVG}rect/{SVG}title")]
    assert titles == ["gpt_block: 2.125 x onnxruntime", "mlp: 0.8125 x onnxruntime"]
    widths = [float(r.get("width")) for r in chart.findall(f".//{SVG}rect")]
    assert widths[0] / widths[1] == pytest.approx(2.125 / 0.8125, rel=0.01)  # linear from zero
    md = md_path.read_text()
    assert "## latency against peers: bench models (1 thread(s) on each side)" in md
    assert "| gpt_block | 2.0000 | 1.0000 | 2.125 | [1.900, 2.300] | opstrata same x1.010 |" in md
    assert "| mlp | 0.4000 | 0.5000 | 0.812 | [0.700, 0.900] |  |" in md
    assert "- a note" in md


def test_peer_latency_without_peers_plots_times(tmp_path) -> None:
    doc = {**MODELS, "rows": [{"bench": "mlp/opstrata", "median_s": 4e-4, "rounds": 5, "model": "mlp",
                               "threads": 2, "runtime": "opstrata"}]}  # fmt: skip
    s = load_section(_write(tmp_path, "solo", doc))
    assert s.kind == "bench-peers" and "2 thread(s)" in s.title
    assert "no onnxruntime rows in this run: times only" in s.notes
    (chart,) = _svgs(s.charts[0])
    assert chart.find(f".//{SVG}rect/{SVG}title").text == "mlp: 0.4 ms"
    assert s.rows == [["mlp", "0.4000", "", "", "", ""]]


def test_comm_section_plots_bus_bandwidth_per_size(tmp_path) -> None:
    s = load_section(_write(tmp_path, "comm", COMM))
    assert (
        s.kind == "bench-comm" and s.title == "comm bus bandwidth against message size: all_reduce, 2 ranks"
    )
    (chart,) = _svgs(s.charts[0])
    assert (chart.get("data-kind"), chart.get("data-points")) == ("line", "3")
    by_size = sorted(COMM["rows"], key=lambda r: r["bytes"])
    points = [float(c.find(f"{SVG}title").text.split(": ")[1]) for c in chart.findall(f".//{SVG}circle")]
    assert points == pytest.approx([r["busbw_GBps"] for r in by_size], rel=1e-3)  # "%.4g" in the titles
    assert [t.text for t in chart.findall(f".//{SVG}text") if t.get("class") == "xtick"] == [
        "4K",
        "64K",
        "1M",
    ]
    assert "(log)" in "".join(t.text or "" for t in chart.findall(f".//{SVG}text"))  # a log axis
    assert [r[0] for r in s.rows] == ["4K", "64K", "1M"]
    assert s.rows[0] == ["4K", "4096", "2", "0.0200", "0.205", "0.205", ""]


def test_comm_section_computes_busbw_when_absent(tmp_path) -> None:
    rows = [{"bench": "all_reduce/1MiB", "median_s": 1e-3, "rounds": 3, "bytes": 1 << 20, "ranks": 4}]
    s = load_section(_write(tmp_path, "c4", {**COMM, "rows": rows}))
    busbw = (1 << 20) * 2 * 3 / 4 / 1e-3 / 1e9
    assert s.rows[0][4] == f"{busbw:.3f}" and s.rows[0][5] == f"{(1 << 20) / 1e-3 / 1e9:.3f}"


def test_bad_bench_json_is_a_clear_error(tmp_path, capsys) -> None:
    bad = _write(tmp_path, "bad", {"suite": "comm", "rows": [{"bench": "x", "median_s": 1e-3}]})
    with pytest.raises(ReportError, match="looks like a results file but a field is missing or bad"):
        load_section(bad)
    assert _cli.main(["report", str(bad), "-o", str(tmp_path / "x.html")]) == 2
    assert "bad.json" in capsys.readouterr().err


def test_report_from_a_real_models_run(tmp_path, capsys) -> None:
    """`opstrata bench models --format json` straight into `opstrata report`: the bars are its ratios."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    argv = ["bench", "models", "--models", "mlp", "--rounds", "3", "--format", "json", "--progress", "plain"]
    assert _cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    path = _write(tmp_path, "run", doc)
    assert _cli.main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 0
    (chart,) = _svgs((tmp_path / "r.html").read_text())
    ratio = next(r["peer_ratio"] for r in doc["rows"] if r["bench"] == "mlp/opstrata")
    assert chart.find(f".//{SVG}rect/{SVG}title").text == f"mlp: {ratio:.4g} x onnxruntime"
