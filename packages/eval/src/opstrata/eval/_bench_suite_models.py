"""The ``models`` and ``zoo`` suites: an opstrata InferenceSession beside onnxruntime on one ONNX file.

Each model gives two benchmarks, ``NAME/opstrata`` and its peer ``NAME/onnxruntime`` (``peer_of``
names the first), run interleaved so per-round ratios compare like with like. Both sides get the
same intra-op thread count (``SessionOptions.intra_op_num_threads``, inter-op 1) and numpy's BLAS
pool is capped at it while they run. ``models`` builds its models with onnx.helper (opstrata.graph's
testing builders); ``zoo`` exports zoo models with torch.onnx (opstrata.eval.zoo's builders and
exporter), caching the exported files per version of torch and the exporters. Without onnxruntime
the peer rows are left out with a note; a model opstrata declines is left out with its reason.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._bench_suites import BenchError, BenchOptions, SuiteRun, run_interleaved

__all__ = ["DEFAULT_ZOO", "MODEL_SPECS", "run_models", "run_zoo"]

OPSTRATA, PEER = "opstrata", "onnxruntime"


@dataclass(frozen=True)
class BuiltModel:
    """A model of the ``models`` suite: its builder (a ModelProto) and the sizes of its feeds."""

    description: str
    build: Callable[[], Any]
    dims: dict[str, int]
    int_high: int = 10


def _specs() -> dict[str, BuiltModel]:
    from opstrata.graph import testing as gt

    return {
        "gpt_block": BuiltModel(
            "GPT-2 decoder layer: hidden 128, 4 heads, vocab 512; ids 2x64",
            lambda: gt.gpt_block_model(hidden=128, heads=4, vocab=512, max_pos=64),
            {"batch": 2, "seq": 64}, int_high=512,
        ),
        "bert_block": BuiltModel(
            "BERT encoder layer: hidden 128, 4 heads, ffn 512; x 2x64x128 with a padding mask",
            lambda: gt.bert_block_model(hidden=128, heads=4, ffn=512), {"batch": 2, "seq": 64},
        ),
        "mlp": BuiltModel(
            "Gemm-Relu-Gemm-Softmax MLP: 256 -> 1024 -> 64; x 32x256",
            lambda: gt.mlp_model(d_in=256, hidden=1024, d_out=64), {"batch": 32},
        ),
        "cnn": BuiltModel(
            "Conv-BN-Relu-MaxPool-Conv-GlobalAveragePool-Gemm CNN; x 8x3x64x64",
            lambda: gt.cnn_model(size=64), {"batch": 8},
        ),
    }  # fmt: skip


#: Names of the models suite's models, in run order (their specs load with opstrata.graph.testing).
MODEL_SPECS = ("gpt_block", "bert_block", "mlp", "cnn")
#: The zoo models timed when --models is not given: small, and each runs in opstrata today.
DEFAULT_ZOO = ("squeezenet1_1", "resnet18", "mobilenet_v3_small", "gpt2")
ZOO_EXPORTER = "dynamo"


def _select(
    asked: list[str] | None, known: tuple[str, ...] | list[str], default: tuple[str, ...], what: str
) -> list[str]:
    names = list(default) if asked is None else asked
    if not names:
        raise BenchError(f"--models: no model names given; pick from {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BenchError(
            f"--models: unknown {what} model(s) {', '.join(map(repr, unknown))}; expected some of {', '.join(known)}"
        )
    return list(dict.fromkeys(names))  # de-duplicated, in the order given


def _check_threads(threads: int) -> None:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise BenchError(f"--threads must be an int >= 1 (the same on both runtimes), got {threads!r}")


def _ort_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


class _Pairs:
    """Collects the candidates, their extra fields and the notes of one models/zoo run."""

    def __init__(self, opts: BenchOptions, suite: str) -> None:
        self.opts, self.suite = opts, suite
        self.candidates: dict[str, Callable[[], object]] = {}
        self.meta: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []
        self.has_peer = _ort_available()
        if not self.has_peer:
            self.notes.append(
                f"onnxruntime is not installed: the {PEER} peer rows are left out "
                "(pip install 'opstrata-eval[peers]')"
            )

    def add(self, name: str, path: Path, feeds: dict[str, np.ndarray], extra: dict[str, Any]) -> None:
        """Open both sessions on ``path``, check they agree on ``feeds``, add their two benchmarks."""
        from opstrata.runtime import InferenceSession, SessionOptions

        from .zoo._compare import TOLERANCE_ORT, max_rel_error
        from .zoo._runner import REFUSALS, _ort_session, _refusal_text, _thread_cap

        threads = self.opts.threads
        with _thread_cap(threads):
            try:
                so = SessionOptions(intra_op_num_threads=threads, inter_op_num_threads=1)
                sess = InferenceSession(str(path), so)
                ours = sess.run(None, feeds)
            except REFUSALS as exc:
                self.notes.append(f"{name}: left out, opstrata declines it: {_refusal_text(exc)}")
                return
        mine = f"{name}/{OPSTRATA}"
        common = {"model": name, "threads": threads, **extra}
        self.candidates[mine] = lambda: sess.run(None, feeds)
        self.meta[mine] = {**common, "runtime": OPSTRATA}
        if not self.has_peer:
            return
        try:
            peer = _ort_session(path, threads)
            theirs = peer.run(None, feeds)
        except Exception as exc:  # the peer failing is a note, not the benchmark's failure
            self.notes.append(
                f"{name}: no {PEER} row, it could not run the model: {type(exc).__name__}: {exc}"
            )
            return
        err = max(max_rel_error(a, e) for a, e in zip(ours, theirs, strict=True))
        if not err <= TOLERANCE_ORT:
            self.notes.append(
                f"{name}: opstrata and {PEER} disagree (max relative error {err:.3g} > {TOLERANCE_ORT:g}); "
                "the timings compare different answers"
            )
        theirs_name = f"{name}/{PEER}"
        self.candidates[theirs_name] = lambda: peer.run(None, feeds)
        self.meta[theirs_name] = {**common, "runtime": PEER, "peer_of": mine}

    def run(self) -> SuiteRun:
        if not self.candidates:
            raise BenchError(f"bench {self.suite}: no model could run; " + "; ".join(self.notes))
        from .zoo._runner import _thread_cap

        with _thread_cap(self.opts.threads):
            samples = run_interleaved(self.candidates, self.opts, f"bench {self.suite}: rounds")
        return SuiteRun(samples, self.meta, self.notes)


def _atomic_save(model: Any, path: Path) -> None:
    ops.atomic_write(path, model.SerializeToString())


def run_models(opts: BenchOptions) -> SuiteRun:
    """opstrata beside onnxruntime on the models built in code (``--models`` picks some)."""
    _check_threads(opts.threads)
    names = _select(opts.models, MODEL_SPECS, MODEL_SPECS, "models-suite")
    try:
        import onnx  # noqa: F401  (the builders write ModelProtos)
    except ImportError as exc:
        raise BenchError(
            f"bench models builds its models with onnx ({exc}); install it: pip install 'opstrata-graph[onnx]'"
        ) from exc
    from opstrata.graph.testing import random_feeds

    specs = _specs()
    pairs = _Pairs(opts, "models")
    with tempfile.TemporaryDirectory(prefix="opstrata-bench-") as tmp:
        with _progress_of(opts, len(names), "bench models: build") as bar:
            for name in names:
                spec = specs[name]
                model = spec.build()
                path = Path(tmp) / f"{name}.onnx"
                _atomic_save(model, path)
                feeds = random_feeds(model, spec.dims, int_high=spec.int_high)
                pairs.add(name, path, feeds, {"description": spec.description})
                bar.update(1, name)
        return pairs.run()


def _progress_of(opts: BenchOptions, total: int, desc: str) -> Any:
    from ._progress import progress

    return progress(opts.progress, total, desc, say=opts.say)


# ---------------------------------------------------------------- zoo


def _export_key() -> str:
    """A digest of what an exported file depends on: torch, the exporters' packages, opstrata-eval."""
    parts = []
    for dist in ("torch", "torchvision", "transformers", "onnxscript", "onnx", "opstrata-eval"):
        try:
            parts.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist}=none")
    return hashlib.sha256(";".join(parts).encode()).hexdigest()[:12]


def _zoo_file(name: str, cache: Path) -> tuple[Path, bool]:
    """The exported file of zoo model ``name`` (exported now unless cached); (path, came from the cache)."""
    from .zoo._export import export_model

    directory = cache / _export_key()
    path = directory / f"{name}.{ZOO_EXPORTER}.onnx"
    if path.is_file() and path.stat().st_size > 0:
        return path, True
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix=f".{name}."))
    try:  # export beside the cache entry, then rename: a reader never sees half a file
        os.replace(export_model(name, ZOO_EXPORTER, tmp), path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path, False


def zoo_cache_dir() -> Path:
    """Where the zoo suite keeps exported files: CACHE_DIR/bench/zoo-exports."""
    from ._info import cache_dir

    return Path(cache_dir(os.environ)["path"]) / "bench" / "zoo-exports"


def run_zoo(opts: BenchOptions) -> SuiteRun:
    """opstrata beside onnxruntime on zoo models exported by torch.onnx (``--models`` picks some)."""
    from .zoo._specs import MODELS

    _check_threads(opts.threads)
    names = _select(opts.models, list(MODELS), DEFAULT_ZOO, "zoo")
    from .zoo._builders import require_torch

    try:
        require_torch()
        import onnx  # noqa: F401  (the exporters write through it)
    except ImportError as exc:
        raise BenchError(f"bench zoo: {exc}") from exc
    from .zoo._export import ExportError, example_input

    cache = zoo_cache_dir()
    pairs = _Pairs(opts, "zoo")
    with _progress_of(opts, len(names), "bench zoo: export") as bar:
        for name in names:
            spec = MODELS[name]
            try:
                path, cached = _zoo_file(name, cache)
            except (ExportError, ImportError) as exc:
                pairs.notes.append(f"{name}: left out, {exc}")
                bar.update(1, f"{name} (export failed)")
                continue
            shape = spec.shapes[0]
            feeds = {spec.input_name: example_input(spec, shape, seed=1).numpy()}
            extra = {"exporter": ZOO_EXPORTER, "input": list(shape), "description": spec.description}
            pairs.add(name, path, feeds, extra)
            bar.update(1, f"{name} ({'cached' if cached else 'exported'})")
    return pairs.run()
