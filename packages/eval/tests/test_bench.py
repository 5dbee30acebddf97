"""Benchmark gate: bootstrap verdicts on seeded synthetic timings, interleaved runs, results files, CLI."""

from __future__ import annotations

import json
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
