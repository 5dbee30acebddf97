"""Benchmark gate: bootstrap verdicts on seeded synthetic timings, interleaved runs, results files, CLI."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pytest

from opstrata.eval import _cli, gate, interleave
from opstrata.eval._bench_results import ResultsError, fingerprint, fingerprint_diff, load, save


def _timings(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    """Noisy timings: lognormal jitter (sigma 5 %) plus a 10 % chance of a 1.5-3x outlier (a busy machine)."""
    t = scale * np.exp(rng.normal(0, 0.05, n))
    busy = rng.random(n) < 0.1
    return np.where(busy, t * rng.uniform(1.5, 3.0, n), t)


@pytest.mark.parametrize("paired", [False, True])
def test_a_a_comparisons_rarely_claim_a_difference(paired) -> None:
    rng = np.random.default_rng(1)
    verdicts = [gate(_timings(rng, 20), _timings(rng, 20), paired=paired, seed=i).verdict for i in range(40)]
    assert sum(v in ("faster", "slower") for v in verdicts) <= 2  # at most 5 %


@pytest.mark.parametrize("paired", [False, True])
def test_a_15_percent_slowdown_is_found(paired) -> None:
    rng = np.random.default_rng(2)
    verdicts = [
        gate(_timings(rng, 20), _timings(rng, 20, 1.15), paired=paired, seed=i).verdict for i in range(40)
    ]
    assert verdicts.count("slower") >= 36  # at least 90 %
    faster = [gate(_timings(rng, 20), _timings(rng, 20, 0.8), seed=i).verdict for i in range(10)]
    assert faster.count("faster") >= 9


def test_verdict_fields_and_bad_samples() -> None:
    v = gate([1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0])
    assert (v.verdict, v.ratio, v.low, v.high) == ("slower", 2.0, 2.0, 2.0)
    assert str(v).startswith("slower: x2.000 (+100.0%), 95% CI [2.000, 2.000]")
    assert gate([1.0] * 5, [1.01] * 5).verdict == "same"
    with pytest.raises(ValueError, match="needs at least 3 timing samples, got 2; run more rounds"):
        gate([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="positive finite times"):
        gate([1.0, 0.0, 1.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="paired samples need equal counts"):
        gate([1.0] * 3, [1.0] * 4, paired=True)


def test_interleaved_run_finds_a_real_slowdown() -> None:
    """A kernel that also sleeps 1 ms (many times its work) is 'slower' with per-round pairing."""

    def work() -> None:
        sum(range(2000))  # pure Python: no BLAS threads to contend with the other processes

    def slowed() -> None:
        work()
        time.sleep(1e-3)

    s = interleave({"base": work, "slow": slowed}, rounds=8, warmup=1, min_time=1e-3)
    assert len(s["base"]) == len(s["slow"]) == 8
    assert gate(s["base"], s["slow"], paired=True).verdict == "slower"
    with pytest.raises(ValueError, match="rounds must be >= 3"):
        interleave({"base": work}, rounds=2)


# ---------------------------------------------------------------- results files


def test_results_roundtrip_and_errors(tmp_path) -> None:
    path = save(tmp_path, "base", "ops", {"a": [1.0, 2.0, 3.0]})
    r = load(tmp_path, "base")
    assert (r.name, r.suite, r.results) == ("base", "ops", {"a": [1.0, 2.0, 3.0]})
    assert r.fingerprint["cores"] and "numpy" in r.fingerprint["versions"]
    with pytest.raises(ResultsError, match=r"no saved results 'other' in .*\(saved: \['base'\]\); create it"):
        load(tmp_path, "other")
    path.write_text("{")
    with pytest.raises(ResultsError, match=r"is corrupt .*; delete it and save the run again"):
        load(tmp_path, "base")
    path.write_text(json.dumps({"schema": 99, "results": {}}))
    with pytest.raises(ResultsError, match="has schema 99, this opstrata-eval reads schema 1"):
        load(tmp_path, "base")
    with pytest.raises(ResultsError, match="use letters, digits"):
        save(tmp_path, "../escape", "ops", {})


def test_fingerprint_diff_names_what_changed() -> None:
    a = fingerprint()
    b = json.loads(json.dumps(a))
    b["versions"]["numpy"] = "0.0"
    b["cores"] = 999
    lines = fingerprint_diff(a, b)
    assert any(line.startswith("numpy: ") for line in lines) and any(
        line.startswith("cores: ") for line in lines
    )
    assert fingerprint_diff(a, a) == []


# ---------------------------------------------------------------- CLI


def test_cli_save_compare_and_gate(tmp_path, capsys) -> None:
    base = ["bench", "ops", "--rounds", "3", "--results", str(tmp_path)]
    assert _cli.main([*base, "--save", "base"]) == 0
    assert (tmp_path / "base.json").is_file()
    capsys.readouterr()
    doc = json.loads((tmp_path / "base.json").read_text())  # a baseline 1000x faster than this machine
    doc["results"] = {k: {"samples": [t * 1e-3 for t in v["samples"]]} for k, v in doc["results"].items()}
    doc["fingerprint"]["versions"]["numpy"] = "0.0"
    (tmp_path / "fast.json").write_text(json.dumps(doc))
    code = _cli.main([*base, "--compare", "fast", "--fail-on-regression", "10", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 1
    verdicts = [r["verdict"] for r in json.loads(out)["rows"]]
    assert verdicts.count("slower") >= len(verdicts) - 1  # 3 rounds on a shared machine: allow one outlier
    assert "warning: the baseline was measured elsewhere: numpy: 0.0 vs" in err
    assert "slower than 'fast' beyond 10%" in err


def test_cli_bad_input(tmp_path, capsys) -> None:
    base = ["bench", "ops", "--results", str(tmp_path)]
    assert _cli.main([*base, "--compare", "missing"]) == 2
    assert "no saved results 'missing'" in capsys.readouterr().err
    assert _cli.main([*base, "--fail-on-regression", "5"]) == 2
    assert "needs --compare NAME" in capsys.readouterr().err
    assert _cli.main([*base, "--rounds", "1"]) == 2


# ---------------------------------------------------------------- suites: models, zoo, comm


def _bench_json(capsys, argv: list[str]) -> tuple[int, dict, str]:
    """Run `opstrata bench ... --format json`; (exit code, the JSON document, stderr)."""
    code = _cli.main([*argv, "--format", "json", "--progress", "plain"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code in (0, 1) else {}), err


def _faster_copy(directory, name: str, new: str, factor: float = 1e-3) -> None:
    """Save run ``name`` again as ``new`` with every sample scaled by ``factor`` (a much faster machine)."""
    doc = json.loads((directory / f"{name}.json").read_text())
    for entry in doc["results"].values():
        entry["samples"] = [t * factor for t in entry["samples"]]
    (directory / f"{new}.json").write_text(json.dumps(doc))


def test_results_carry_extra_fields_and_older_files_still_load(tmp_path) -> None:
    meta = {"m/opstrata": {"threads": 1, "runtime": "opstrata"}, "m/onnxruntime": {"peer_of": "m/opstrata"}}
    save(tmp_path, "new", "models", {"m/opstrata": [1.0, 2.0, 3.0], "m/onnxruntime": [1.0] * 3}, meta)
    r = load(tmp_path, "new")
    assert r.meta == meta and r.results["m/opstrata"] == [1.0, 2.0, 3.0]
    entry = json.loads((tmp_path / "new.json").read_text())["results"]["m/onnxruntime"]
    assert entry == {"peer_of": "m/opstrata", "samples": [1.0, 1.0, 1.0]}  # fields beside the samples
    old = {"schema": 1, "name": "old", "suite": "ops", "created": "2024", "fingerprint": {},
           "results": {"a": {"samples": [1, 2, 3]}}}  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert load(tmp_path, "old").meta == {"a": {}}
    with pytest.raises(ResultsError, match="may not be named 'samples'"):
        save(tmp_path, "x", "ops", {"a": [1.0]}, {"a": {"samples": 1}})
    assert not (tmp_path / "x.json").exists()


def test_interleave_reports_each_measured_round() -> None:
    seen: list[int] = []
    interleave({"a": lambda: None}, rounds=4, warmup=1, min_time=1e-4, on_round=seen.append)
    assert seen == [1, 2, 3, 4]


def test_models_suite_times_opstrata_beside_onnxruntime_and_gates(tmp_path, capsys, monkeypatch) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import opstrata.runtime as rt
    from opstrata.eval.zoo import _runner

    threads_seen: dict[str, list[int]] = {"opstrata": [], "onnxruntime": []}
    real_session, real_ort = rt.InferenceSession, _runner._ort_session

    def session(model, options=None, *a, **k):
        threads_seen["opstrata"].append(options.intra_op_num_threads)
        return real_session(model, options, *a, **k)

    def ort_session(path, threads):
        threads_seen["onnxruntime"].append(threads)
        return real_ort(path, threads)

    monkeypatch.setattr(rt, "InferenceSession", session)
    monkeypatch.setattr(_runner, "_ort_session", ort_session)
    base = [
        "bench",
        "models",
        "--models",
        "mlp",
        "--rounds",
        "3",
        "--threads",
        "2",
        "--results",
        str(tmp_path),
    ]
    code, doc, err = _bench_json(capsys, [*base, "--save", "m"])
    assert code == 0, err
    assert threads_seen == {"opstrata": [2], "onnxruntime": [2]}  # the same thread count on both sides
    rows = {r["bench"]: r for r in doc["rows"]}
    assert set(rows) == {"mlp/opstrata", "mlp/onnxruntime"}
    ours, theirs = rows["mlp/opstrata"], rows["mlp/onnxruntime"]
    assert (ours["threads"], theirs["threads"], theirs["peer_of"], ours["peer"]) == (
        2,
        2,
        "mlp/opstrata",
        "mlp/onnxruntime",
    )
    saved = load(tmp_path, "m")
    assert saved.suite == "models" and all(len(v) == 3 for v in saved.results.values())
    ratios = np.array(saved.results["mlp/opstrata"]) / np.array(saved.results["mlp/onnxruntime"])
    assert ours["peer_ratio"] == pytest.approx(float(np.median(ratios)))  # median of per-round ratios
    assert ours["peer_ci"][0] <= ours["peer_ratio"] <= ours["peer_ci"][1]
    assert saved.meta["mlp/onnxruntime"]["peer_of"] == "mlp/opstrata"
    assert saved.meta["mlp/opstrata"]["peer_ratio"] == pytest.approx(ours["peer_ratio"])
    assert saved.meta["mlp/opstrata"]["threads"] == 2

    _faster_copy(tmp_path, "m", "fast")
    code, doc, err = _bench_json(capsys, [*base, "--compare", "fast", "--fail-on-regression", "10"])
    assert code == 1 and "slower than 'fast' beyond 10%: mlp/opstrata\n" in err  # the peer is not gated
    assert [r["verdict"] for r in doc["rows"]] == ["slower", "slower"]
    doc = json.loads((tmp_path / "m.json").read_text())  # only the peer got slower: reported, exit 0
    doc["results"]["mlp/onnxruntime"]["samples"] = [
        t * 1e-3 for t in doc["results"]["mlp/onnxruntime"]["samples"]
    ]
    # opstrata's own baseline 1000x slower: its verdict is "faster" however loaded the machine is
    doc["results"]["mlp/opstrata"]["samples"] = [t * 1e3 for t in doc["results"]["mlp/opstrata"]["samples"]]
    (tmp_path / "peer.json").write_text(json.dumps(doc))
    code, doc, err = _bench_json(capsys, [*base, "--compare", "peer", "--fail-on-regression", "10"])
    assert code == 0 and {r["bench"]: r["verdict"] for r in doc["rows"]}["mlp/onnxruntime"] == "slower"
    one_thread = [*base[:6], "--threads", "1", "--results", str(tmp_path), "--compare", "m"]
    code, doc, err = _bench_json(capsys, one_thread)
    assert code == 0 and "mlp/opstrata: threads 2 in the baseline, 1 now" in err


def test_models_suite_text_and_no_onnxruntime(tmp_path, capsys, monkeypatch) -> None:
    pytest.importorskip("onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    argv = ["bench", "models", "--models", "mlp", "--rounds", "3", "--progress", "plain"]
    assert _cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "onnxruntime is not installed: the onnxruntime peer rows are left out" in err
    assert "[3/3] bench models: rounds" in err  # progress on stderr
    lines = out.splitlines()
    assert lines[0] == "opstrata bench models: 3 interleaved rounds, 1 thread(s) on each side"
    assert lines[2].split()[0] == "mlp" and lines[2].split()[-1] == "-"  # no peer: no ratio
    code, doc, _ = _bench_json(capsys, argv[:-2])
    assert code == 0 and [r["bench"] for r in doc["rows"]] == ["mlp/opstrata"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["models", "--models", "gpt_block,nope"],
            "unknown models-suite model(s) 'nope'; expected some of gpt_block",
        ),
        (["models", "--models", "mlp,"], "without empty entries"),
        (["models", "--threads", "0"], "--threads must be an int >= 1"),
        (["models", "--sizes", "4K"], "--sizes applies to the comm suite(s), not models"),
        (["ops", "--threads", "2"], "--threads applies to the models and zoo suite(s), not ops"),
        (["zoo", "--models", "resnet"], "unknown zoo model(s) 'resnet'"),
        (["comm", "--sizes", "3"], "'3' is 3 bytes; expected a positive multiple of 4 bytes"),
        (["comm", "--sizes", "4X"], "cannot read '4X'; expected comma-separated sizes like 4K,64K,1M,16M"),
        (["comm", "--sizes", "4K,4096"], "names a size twice"),
        (["comm", "--ranks", "1"], "--ranks must be an int in 2..64"),
        (["comm", "--models", "mlp"], "--models applies to the models and zoo suite(s), not comm"),
    ],
)
def test_suite_bad_input_exits_2(argv, message, tmp_path, capsys) -> None:
    assert _cli.main(["bench", *argv, "--rounds", "3", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("opstrata bench: error: ") and message in err


def test_parse_sizes_units() -> None:
    from opstrata.eval._bench_suite_comm import busbw, format_size, parse_sizes

    assert parse_sizes("4K,64KiB,1M,16MiB,8") == [4096, 65536, 1 << 20, 16 << 20, 8]
    assert [format_size(n) for n in (4096, 1 << 20, 100)] == ["4KiB", "1MiB", "100B"]
    assert busbw(1_000_000_000, 4, 1.0) == pytest.approx(1.5)  # 2(n-1)/n = 1.5


def test_comm_suite_bus_bandwidth_roundtrip_and_gate(tmp_path, capsys) -> None:
    base = ["bench", "comm", "--ranks", "2", "--sizes", "4K,64K", "--rounds", "3", "--results", str(tmp_path)]
    code, doc, err = _bench_json(capsys, [*base, "--save", "c"])
    assert code == 0, err
    rows = doc["rows"]
    assert [r["bench"] for r in rows] == ["all_reduce/4KiB", "all_reduce/64KiB"]
    saved = load(tmp_path, "c")
    for r in rows:
        assert (r["ranks"], r["rounds"]) == (2, 3) and r["bytes"] in (4096, 65536)
        t = float(np.median(saved.results[r["bench"]]))
        assert r["median_s"] == pytest.approx(t)
        assert r["busbw_GBps"] == pytest.approx(r["bytes"] * 2 * (2 - 1) / 2 / t / 1e9)  # NCCL-tests' busbw
        assert saved.meta[r["bench"]]["bytes"] == r["bytes"]
        assert saved.meta[r["bench"]]["busbw_GBps"] == pytest.approx(r["busbw_GBps"])
    _faster_copy(tmp_path, "c", "fast")
    code, doc, err = _bench_json(capsys, [*base, "--compare", "fast", "--fail-on-regression", "10"])
    assert code == 1 and [r["verdict"] for r in doc["rows"]] == ["slower", "slower"]
    assert _cli.main([*base[:4], "--sizes", "4K", "--rounds", "3"]) == 0
    out = capsys.readouterr().out
    assert "all_reduce float32 sum on 2 ranks (shm)" in out and "busbw GB/s" in out
    assert out.splitlines()[2].split()[:2] == ["4KiB", "4096"]


def test_zoo_suite_without_torch_names_the_extra(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    assert _cli.main(["bench", "zoo", "--models", "squeezenet1_1", "--rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert "bench zoo: the model zoo needs torch" in err and "[zoo]" in err


def test_zoo_suite_one_small_model(tmp_path, capsys, monkeypatch) -> None:
    for name in ("torch", "torchvision", "onnxscript", "onnx", "onnxruntime"):
        pytest.importorskip(name, reason=f"the zoo suite needs {name}: pip install './packages/eval[zoo]'")
    from opstrata.eval import _bench_suite_models

    monkeypatch.setattr(_bench_suite_models, "zoo_cache_dir", lambda: tmp_path / "exports")
    argv = ["bench", "zoo", "--models", "squeezenet1_1", "--rounds", "3", "--results", str(tmp_path)]
    code, doc, err = _bench_json(capsys, argv)
    assert code == 0, err
    assert "squeezenet1_1 (exported)" in err
    rows = {r["bench"]: r for r in doc["rows"]}
    assert set(rows) == {"squeezenet1_1/opstrata", "squeezenet1_1/onnxruntime"}
    assert (
        rows["squeezenet1_1/opstrata"]["exporter"] == "dynamo"
        and rows["squeezenet1_1/opstrata"]["peer_ratio"] > 0
    )
    assert len(list((tmp_path / "exports").glob("*/squeezenet1_1.dynamo.onnx"))) == 1
    code, _, err = _bench_json(capsys, argv)
    assert code == 0 and "squeezenet1_1 (cached)" in err
