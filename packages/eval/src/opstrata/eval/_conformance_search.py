"""Property search for ``conformance_ops(examples=N)``: hypothesis draws inputs for the shape-searched ops
and, when the device under test disagrees with the reference, shrinks to the smallest input that shows it.

The fixed variants (normal, size-1, empty, broadcast, NaN/inf, extreme) test the shapes a porting team
expects; the search adds what nobody wrote down: shapes of any rank up to the op's base rank with
sides 0-5 (mutually broadcastable for two-tensor ops), and values from hypothesis' float and integer
strategies (NaN, infinities, subnormals, signed zeros, the dtype's extremes). Seeded by the conformance
seed, so a run is reproducible on any install; an input the reference refuses is rejected, not counted. Needs hypothesis
(``pip install 'opstrata-eval[conformance]'``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._tolerances import dtype_class

__all__ = ["Found", "SearchUnavailable", "search"]

#: The longest side a drawn shape has (small: shrinking is quick and a reproducer stays readable).
MAX_SIDE = 5


class SearchUnavailable(RuntimeError):
    """hypothesis is not installed: names the extra."""


@dataclass
class Found(Exception):
    """The shrunk input on which the device under test disagrees with the reference."""

    case: tuple[str, tuple[np.ndarray, ...], dict[str, Any]]
    got: Sequence[Any]
    want: Sequence[Any]
    problem: str
    error: float


def _hypothesis() -> Any:
    try:
        import hypothesis
        from hypothesis.extra import numpy as hnp
    except ImportError as exc:
        raise SearchUnavailable(
            f"conformance: --examples needs hypothesis ({exc}); install: pip install 'opstrata-eval[conformance]'"
        ) from None
    return hypothesis, hnp


def _elements(st: Any, dt: np.dtype) -> Any:
    """Values for ``dt``: integers over its range; floats from float32's (cast), with NaN and infinities."""
    if dtype_class(dt) in ("int", "bool"):
        if dt == np.bool_:
            return st.booleans()
        info = np.iinfo(dt)
        return st.integers(int(info.min), int(info.max))
    return st.floats(width=32, allow_nan=True, allow_infinity=True)


def search(
    fn: Callable[..., Any], dt: np.dtype, base_rank: int, arity: int, examples: int, seed: int,
    run: Callable[[tuple[str, tuple[np.ndarray, ...], dict[str, Any]]], tuple[str, float, Sequence[Any], Sequence[Any]] | None],
) -> Found | None:  # fmt: skip
    """Draw ``examples`` inputs for a one- or two-tensor op; ``run(case)`` returns None when the reference
    refuses the input, else (problem or "", error, got, want). The shrunk disagreement, or None."""
    hypothesis, hnp = _hypothesis()
    st = hypothesis.strategies
    elements = _elements(st, dt)
    draw_dtype = dt if dtype_class(dt) in ("int", "bool") else np.dtype(np.float32)

    @hypothesis.settings(
        max_examples=examples, deadline=None, database=None, print_blob=False,
        suppress_health_check=list(hypothesis.HealthCheck),
        phases=[hypothesis.Phase.generate, hypothesis.Phase.shrink],
    )  # fmt: skip
    @hypothesis.seed(seed)
    @hypothesis.given(data=st.data())
    def prop(data: Any) -> None:
        shapes = data.draw(
            hnp.mutually_broadcastable_shapes(
                num_shapes=arity, min_dims=0, max_dims=max(base_rank, 1), min_side=0, max_side=MAX_SIDE
            ).map(lambda b: b.input_shapes)
        )
        args = tuple(
            data.draw(hnp.arrays(draw_dtype, shape, elements=elements)).astype(dt, copy=False)
            for shape in shapes
        )
        outcome = run(("hypothesis", args, {}))
        if outcome is None:
            hypothesis.reject()  # the reference refuses: not an input of this op
        problem, error, got, want = outcome  # type: ignore[misc]
        if problem:
            raise Found(("hypothesis (shrunk)", args, {}), got, want, problem, error)

    try:
        prop()
    except Found as found:
        return found
    except hypothesis.errors.Unsatisfiable:  # the reference refused every drawn input
        return None
    except Exception as exc:  # a failure that did not reproduce comes wrapped (hypothesis' FlakyFailure)
        inner = [e for e in getattr(exc, "exceptions", ()) if isinstance(e, Found)]
        if inner:
            return inner[0]
        raise
    return None
