"""`opstrata report`: a self-contained HTML file whose figures plot what the results hold, plus markdown."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import opstrata.runtime as rt  # noqa: E402
from opstrata.eval import ReportError, _cli, build_report, conformance_ops, diff_model, drift_model  # noqa: E402
from opstrata.graph.testing import mlp_model, random_feeds  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("report")
    model = mlp_model()
    files = {
        "diff": diff_model(model, "ref").to_dict(),
        "drift": drift_model(model, "bfloat16").to_dict(),
        "conformance": conformance_ops("cpu", op_names=["abs", "add"], dtypes=["float32"]).to_dict(),
        "bench": {"suite": "ops", "baseline": "base", "fingerprint_differences": [], "rows": [
            {"bench": "matmul", "median_s": 2e-3, "rounds": 5, "baseline_median_s": 1e-3, "ratio": 2.0,
             "ci": [1.9, 2.1], "verdict": "slower"},
            {"bench": "add", "median_s": 1e-5, "rounds": 5}]},
    }  # fmt: skip
    paths = {}
    for name, doc in files.items():
        paths[name] = d / f"{name}.json"
        paths[name].write_text(json.dumps(doc))
    opts = rt.SessionOptions(enable_profiling=True)
    sess = rt.InferenceSession(model, opts)
    sess.run(None, random_feeds(model, {"batch": 2}))
    paths["trace"] = Path(sess.end_profiling(d / "trace.json"))
    return {**paths, "dir": d}


def _svgs(html: str) -> list[ET.Element]:
    return [ET.fromstring(s) for s in re.findall(r"<svg.*?</svg>", html, re.S)]


def test_report_has_one_readable_figure_per_result(results, tmp_path) -> None:
    order = ["diff", "drift", "bench", "conformance", "trace"]
    html_path, md_path = build_report([results[k] for k in order], tmp_path / "r.html")
    html = html_path.read_text()
    assert (
        html.startswith("<!doctype html>") and "<script" not in html and "http" not in html.split("<svg")[0]
    )
    figures = _svgs(html)
    assert [f.get("data-kind") for f in figures] == ["line", "line", "bar", "bar", "bar", "bar"]
    diff = json.loads(results["diff"].read_text())
    drift = json.loads(results["drift"].read_text())
    assert int(figures[0].get("data-points")) == len(diff["rows"])  # a point per node output
    assert len(figures[0].findall(f".//{SVG}circle")) == len(diff["rows"])
    assert int(figures[1].get("data-points")) == len(drift["rows"])
    bars = figures[2].findall(f".//{SVG}rect")
    widths = [float(b.get("width")) for b in bars]  # matmul 2 ms, its baseline 1 ms, add 0.01 ms
    assert len(bars) == 3 and widths[0] > widths[1] > widths[2] >= 1
    assert widths[0] == pytest.approx(2 * widths[1], rel=0.01)  # a linear axis from zero
    labels = [t.text for t in figures[4].findall(f".//{SVG}text")]
    assert "Linear" in labels or "Softmax" in labels  # time per op type of the profiled session
    trace = json.loads(results["trace"].read_text())["traceEvents"]
    nodes = {e["name"] for e in trace if e.get("ph") == "X" and e.get("cat") != "session"}
    node_bars = figures[5].findall(f".//{SVG}rect")  # time per node: one bar per node (at most 20)
    assert len(node_bars) == min(20, len(nodes)) > 0
    assert {b.find(f"{SVG}title").text.split(":")[0] for b in node_bars} <= nodes
    for f in figures:
        assert f.get("aria-label") and f.find(f"{SVG}text").text  # titled
    md = md_path.read_text()
    assert md.startswith("# opstrata report") and "| # | node | op | output |" in md and "(r.html)" in md


def test_cli_and_bad_input(results, tmp_path, capsys) -> None:
    assert _cli.main(["report", str(results["drift"]), "-o", str(tmp_path / "x.html")]) == 0
    assert (tmp_path / "x.html").is_file() and (tmp_path / "x.md").is_file()
    junk = tmp_path / "junk.json"
    junk.write_text(json.dumps({"hello": 1}))
    (tmp_path / "broken.json").write_text("{")
    for path, msg in [
        (junk, "not a results file this report knows; expected diff, drift, bench"),
        (tmp_path / "broken.json", "not JSON"),
        (tmp_path / "missing.json", "cannot read"),
    ]:
        assert _cli.main(["report", str(path), "-o", str(tmp_path / "y.html")]) == 2
        assert msg in capsys.readouterr().err
    with pytest.raises(ReportError, match="does not exist; create it first"):
        build_report([results["drift"]], tmp_path / "no" / "r.html")
    with pytest.raises(ReportError, match="no results files given"):
        build_report([], tmp_path / "r.html")


def _browser() -> str | None:
    return next((p for n in ("chromium", "chromium-browser", "google-chrome", "headless_shell")
                 if (p := shutil.which(n))), None)  # fmt: skip


@pytest.mark.skipif(_browser() is None, reason="no headless Chromium on this machine (apt install chromium)")
def test_report_renders_its_plots_in_a_real_browser(results, tmp_path) -> None:
    html, _ = build_report([results["drift"], results["bench"]], tmp_path / "r.html")
    shot = tmp_path / "shot.png"
    image = pytest.importorskip(
        "PIL.Image", reason="Pillow reads the screenshot (it comes with the zoo extra)"
    )
    # no network chatter on a closed machine: background networking, component updates and sync are off
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=900,1400"]  # fmt: skip
    subprocess.run([_browser(), *flags, html.as_uri()], check=True, capture_output=True, timeout=60)
    # the screenshot must show the red drift line and the blue bars
    img = np.asarray(image.open(shot).convert("RGB")).astype(int)
    red = np.sum(
        (abs(img[..., 0] - 0xE4) < 30) & (abs(img[..., 1] - 0x57) < 30) & (abs(img[..., 2] - 0x56) < 30)
    )
    blue = np.sum(
        (abs(img[..., 0] - 0x4C) < 30) & (abs(img[..., 1] - 0x78) < 30) & (abs(img[..., 2] - 0xA8) < 30)
    )
    assert red > 50 and blue > 200


def test_report_on_the_demos_outputs(tmp_path, capsys) -> None:
    """`opstrata demo` writes model.onnx and profile.json; the report built from its profile, the model's
    bfloat16 drift and its memory timeline holds one readable figure per input, each plotting that input."""
    from opstrata.eval._demo import run_demo

    result = run_demo(tmp_path / "demo", tp=1, new_tokens=2, say=lambda _line: None)
    assert result.ok and result.model_path is not None and result.trace_path is not None
    model, drift, memory = str(result.model_path), tmp_path / "drift.json", tmp_path / "memory.json"
    dims = ["--dim", "batch=2", "--dim", "seq=12"]
    assert _cli.main(["diff", model, "--drift", *dims, "--format", "json", "-o", str(drift)]) == 0
    assert _cli.main(["run", model, "--random", *dims, "--repeat", "1", "--memory", str(memory)]) == 0
    capsys.readouterr()
    html_path, md_path = build_report([result.trace_path, drift, memory], tmp_path / "demo.html")
    figures = _svgs(html_path.read_text())
    assert [f.get("data-kind") for f in figures] == ["bar", "bar", "line", "line"]
    trace = json.loads(Path(result.trace_path).read_text())["traceEvents"]
    op_types = {e["args"]["op_type"] for e in trace if e.get("ph") == "X" and e.get("cat") != "session"}
    assert int(figures[0].get("data-points")) == min(20, len(op_types))
    assert int(figures[2].get("data-points")) == len(json.loads(drift.read_text())["rows"])
    assert int(figures[3].get("data-points")) == len(json.loads(memory.read_text())["steps"])
    for f in figures:
        assert f.get("aria-label") and (f.findall(f".//{SVG}rect") or f.findall(f".//{SVG}circle"))
    md = md_path.read_text()
    assert "time per op type and per node" in md and "drift against float64" in md and "memory timeline" in md
