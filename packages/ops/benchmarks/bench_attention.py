"""FlashAttention-2 on cpu against straightforward numpy attention: time ratios and peak extra memory.

Run: ``PYTHONPATH=packages/ops/src python packages/ops/benchmarks/bench_attention.py [--quick] [--sweep]``.
Prints a markdown table: per case the median time of each candidate, the speedup ``baseline median
/ flash median`` from interleaved runs (``benchtools.compare``) and the peak extra memory each one
allocates (tracemalloc; numpy reports its allocations to it). Targets (issue 4): causal B=1, H=8,
N=4096, D=64 fp32 at least 1.5x faster than numpy with at most 1/8 of its peak memory; non-causal no
slower. ``--sweep`` times block sizes on the causal case (how the defaults were chosen); ``--backward`` times
forward + backward at N/2 against numpy keeping the probabilities. When torch is
importable, ``F.scaled_dot_product_attention`` on the CPU is timed too.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

import opstrata.ops as ops
from opstrata.ops.benchtools import compare, format_table
from opstrata.ops.kernels.attention import attention_rows_cpu
from opstrata.ops.kernels.flash_attention import attention_cpu

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: idle OpenMP threads must not spin


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """The straightforward formula: full scores, tril mask, stable softmax, matmul."""
    n, m = q.shape[-2], k.shape[-2]
    scores = q @ k.swapaxes(-1, -2) * np.float32(1.0 / math.sqrt(q.shape[-1]))  # (B, H, N, M)
    if causal:
        scores = np.where(np.tril(np.ones((n, m), dtype=bool), m - n), scores, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v  # (B, H, N, Dv)


def numpy_attention_train(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, go: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Causal forward keeping the probabilities, then the backward by hand: ``(out, dq, dk, dv)``."""
    n, m = q.shape[-2], k.shape[-2]
    scale = np.float32(1.0 / math.sqrt(q.shape[-1]))
    scores = np.where(np.tril(np.ones((n, m), dtype=bool), m - n), q @ k.swapaxes(-1, -2) * scale, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)  # (B, H, N, M), saved for the backward
    out = p @ v
    dp = go @ v.swapaxes(-1, -2)  # (B, H, N, M)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) * scale
    return out, ds @ k, ds.swapaxes(-1, -2) @ q, p.swapaxes(-1, -2) @ go


def flash_train(q: np.ndarray, k: np.ndarray, v: np.ndarray, go: np.ndarray) -> tuple[np.ndarray, ...]:
    out, lse = ops.attention(q, k, v, causal=True, return_lse=True, device="cpu")
    return (out, *ops.attention_backward(q, k, v, out, go, lse, causal=True, device="cpu"))


def run_train_case(shape: tuple[int, int, int, int], repeats: int) -> list[list[object]]:
    rng = np.random.default_rng(1)
    q, k, v, go = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
    for a, b in zip(flash_train(q, k, v, go), numpy_attention_train(q, k, v, go), strict=True):
        assert np.allclose(a, b, atol=1e-3), "flash and numpy gradients disagree"
    cands = {"numpy": lambda: numpy_attention_train(q, k, v, go), "flash": lambda: flash_train(q, k, v, go)}
    times = compare(cands, repeats=repeats)
    mem = {name: peak_extra_bytes(fn) for name, fn in cands.items()}
    base, flash = times["numpy"].median, times["flash"].median
    label = f"causal fwd+bwd B,H,N,D={shape}"
    return [
        [
            label,
            name,
            f"{t.median * 1e3:.0f} ms",
            f"{base / t.median:.2f}x",
            f"{t.median / flash:.2f}x",
            _mib(mem[name]),
            f"{mem[name] / mem['flash']:.0f}x",
        ]
        for name, t in times.items()
    ]


def _torch_sdpa() -> Callable[..., Any] | None:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None

    def run(q: Any, k: Any, v: Any, causal: bool) -> Any:
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    run.torch = torch  # type: ignore[attr-defined]
    return run


def candidates(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, rows: bool
) -> dict[str, Callable[[], object]]:
    out: dict[str, Callable[[], object]] = {
        "numpy": lambda: numpy_attention(q, k, v, causal),
        "flash": lambda: ops.attention(q, k, v, causal=causal, device="cpu"),
    }
    if rows:
        out["rows (previous cpu)"] = lambda: attention_rows_cpu(q, k, v, causal=causal)
    sdpa = _torch_sdpa()
    if sdpa is not None:
        tq, tk, tv = (sdpa.torch.from_numpy(t) for t in (q, k, v))  # type: ignore[attr-defined]
        out["torch sdpa"] = lambda: sdpa(tq, tk, tv, causal)
    return out


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes allocated while ``fn`` runs, above what was live before (result included)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def run_case(shape: tuple[int, int, int, int], causal: bool, repeats: int, rows: bool) -> list[list[object]]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    cands = candidates(q, k, v, causal, rows)
    assert np.allclose(cands["flash"](), numpy_attention(q, k, v, causal), atol=1e-5)
    times = compare(cands, repeats=repeats)
    mem = {name: peak_extra_bytes(fn) for name, fn in cands.items() if name != "torch sdpa"}
    base, flash = times["numpy"].median, times["flash"].median
    label = f"{'causal' if causal else 'full'} B,H,N,D={shape}"
    table = []
    for name, t in times.items():
        speed = f"{base / t.median:.2f}x" if name != "numpy" else "1.00x"
        vs_flash = f"{t.median / flash:.2f}x" if name != "flash" else "1.00x"
        peak = _mib(mem[name]) if name in mem else "n/a"
        ratio = f"{mem[name] / mem['flash']:.0f}x" if name in mem and mem["flash"] else "n/a"
        table.append([label, name, f"{t.median * 1e3:.0f} ms", speed, vs_flash, peak, ratio])
    return table


def sweep(n: int, repeats: int) -> None:
    """Time ``(block_q rows, block_k)`` pairs on causal B=1, H=8, N, D=64 against the default."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, n, 64), dtype=np.float32) for _ in range(3))
    grid = [(bq, bk) for bq in (64, 128, 256) for bk in (256, 512, 1024)]
    cands = {
        f"{bq}x{bk}": (lambda bq=bq, bk=bk: attention_cpu(q, k, v, causal=True, block_q=bq, block_k=bk))
        for bq, bk in grid
    }
    times = compare(cands, repeats=repeats)
    best = min(t.median for t in times.values())
    rows = [[name, f"{t.median * 1e3:.0f} ms", f"{t.median / best:.2f}"] for name, t in times.items()]
    print(f"\nblock sweep, causal B=1 H=8 N={n} D=64 fp32 (time / best)\n")
    print(format_table(["block_q x block_k", "median", "vs best"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N=1024 and 3 repeats (development)")
    ap.add_argument("--sweep", action="store_true", help="also time a grid of block sizes")
    ap.add_argument("--backward", action="store_true", help="also time forward + backward (training)")
    args = ap.parse_args()
    n, repeats = (1024, 3) if args.quick else (4096, 5)
    print(f"# attention, numpy {np.__version__}, {platform.machine()}, {os.cpu_count()} cpus\n")
    table: list[list[object]] = []
    for causal in (True, False):
        table += run_case((1, 8, n, 64), causal, repeats, rows=True)
    if args.backward:
        table += run_train_case((1, 8, n // 2, 64), repeats)
    headers = ["case", "candidate", "median", "numpy / it", "it / flash", "peak extra", "peak / flash"]
    print(format_table(headers, table))
    if args.sweep:
        sweep(n, repeats)


if __name__ == "__main__":
    main()
