"""Significance of a difference between two systems evaluated on the same queries.

:func:`paired_bootstrap` gives a percentile bootstrap confidence interval of the mean
per-query difference ``mean(a - b)`` (Efron & Tibshirani 1993, *An Introduction to the
Bootstrap*, ch. 13, percentile interval; the paired form, where both systems are scored on
the same resampled test set, is Koehn 2004, *Statistical Significance Tests for Machine
Translation Evaluation*). Pairing matters: per-query scores of two systems are strongly
correlated (hard queries are hard for both), so resampling the differences gives a much
narrower, correct interval than resampling each system on its own.

Per-query inputs come e.g. from ``docent_jax.evaluate.evaluate_scores(..., per_query=True)``.
Pure numpy.
"""

from __future__ import annotations

import dataclasses

import numpy as np

_MAX_ENTRIES = 1 << 22
"""Resampled entries (queries x resamples) held at once by default: about 4M, i.e. a few
arrays of 32 MB each, well under a 50M-entry ceiling; larger chunks would not be faster."""


@dataclasses.dataclass(frozen=True)
class BootstrapInterval:
    """A bootstrap confidence interval of ``mean(a - b)``.

    Attributes:
      mean_difference: ``mean(a - b)`` on the original queries.
      low, high: the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of the
        resampled means (``low <= high``).
      num_samples: number of bootstrap resamples.
      confidence: the interval's nominal coverage, in (0, 1).
    """

    mean_difference: float
    low: float
    high: float
    num_samples: int
    confidence: float


def _per_query(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per query), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: no queries to resample")
    if not (arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.number)) or np.iscomplexobj(arr):
        raise ValueError(f"{name} must be real numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        bad = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise ValueError(f"{name} must be finite, got {arr[bad]} at index {bad}")
    return arr


def _positive_int(x, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise ValueError(f"{name} must be a positive integer, got {x!r}")
    return int(x)


def paired_bootstrap(
    a,
    b,
    *,
    num_samples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    chunk_size: int | None = None,
) -> BootstrapInterval:
    """Percentile bootstrap confidence interval of ``mean(a - b)`` over queries (paired).

    Each resample draws ``n`` query indices uniformly with replacement and takes the mean of
    ``a[idx] - b[idx]``: the *same* indices for both systems, so the resample statistic is
    the mean of the resampled differences. The interval is the ``(1 - confidence) / 2`` and
    ``(1 + confidence) / 2`` quantiles (numpy's linear interpolation, as
    ``scipy.stats.bootstrap(..., method='percentile')``) of the ``num_samples`` resampled
    means. The interval is exact for degenerate data: ``a == b`` gives ``0 [0, 0]`` and a
    constant difference ``c`` gives ``c [c, c]``.

    Resamples are drawn ``chunk_size`` at a time (vectorised), so at most
    ``chunk_size * n`` indices are in memory; the result does not depend on ``chunk_size``.

    Args:
      a: ``[n_queries]`` real per-query scores of system A (float, int or bool; cast to
        float64), e.g. a metric's values from ``docent_jax.evaluate.evaluate_scores(...,
        per_query=True)``.
      b: ``[n_queries]`` the same metric of system B on the same queries, same order.
      num_samples: number of bootstrap resamples, a positive int (10,000 is customary).
      confidence: nominal coverage, in (0, 1).
      seed: seed of ``np.random.default_rng``; the same seed gives the same interval.
      chunk_size: resamples drawn at once, a positive int; default keeps
        ``chunk_size * n_queries`` around 4M entries (never above 50M unless one resample
        alone is larger).

    Returns:
      A :class:`BootstrapInterval` of Python floats (differences in the units of ``a``).

    Raises:
      ValueError: ``a`` or ``b`` not 1-D, empty, non-numeric or not finite (NaN, inf);
        different lengths; ``confidence`` outside (0, 1); non-positive ``num_samples`` or
        ``chunk_size``.
    """
    a_arr, b_arr = _per_query(a, "a"), _per_query(b, "b")
    if a_arr.shape != b_arr.shape:
        raise ValueError(f"a and b must have the same length (paired queries), got "
                         f"{a_arr.size} and {b_arr.size}")
    num_samples = _positive_int(num_samples, "num_samples")
    if not isinstance(confidence, (int, float, np.floating)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    n = a_arr.size
    chunk = (max(1, _MAX_ENTRIES // n) if chunk_size is None
             else _positive_int(chunk_size, "chunk_size"))
    diff = a_arr - b_arr
    # Resample the differences relative to one of them: a constant difference then gives
    # exactly 0 deviations (so exactly [c, c]); it also avoids cancellation for large values.
    shift = diff[0]
    centred = diff - shift
    rng = np.random.default_rng(seed)
    means = np.empty(num_samples, dtype=np.float64)
    for start in range(0, num_samples, chunk):
        rows = min(chunk, num_samples - start)
        # Indices from uniform doubles, not rng.integers: Generator.integers buffers 32-bit
        # draws within one call, so its stream would depend on how the resamples are
        # chunked; rng.random consumes one 64-bit draw per value in any chunking.
        u = rng.random((rows, n))
        u *= n
        idx = u.astype(np.intp)
        del u
        np.minimum(idx, n - 1, out=idx)  # u * n can round up to n for u just below 1
        means[start : start + rows] = centred[idx].mean(axis=1)
    alpha = (1.0 - float(confidence)) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return BootstrapInterval(
        mean_difference=float(shift + centred.mean()),
        low=float(shift + low),
        high=float(shift + high),
        num_samples=num_samples,
        confidence=float(confidence),
    )


def format_interval(interval: BootstrapInterval, scale: float = 100, digits: int = 2) -> str:
    """``"+1.23 [-0.45, +2.87]"``: the mean difference and its interval, times ``scale``.

    Args:
      interval: from :func:`paired_bootstrap`.
      scale: multiplier, 100 for metrics in [0, 1] reported in points (percent).
      digits: decimals.

    Returns:
      The signed mean difference followed by the signed bounds in brackets.
    """
    def fmt(x: float) -> str:
        return f"{scale * x:+.{digits}f}"

    return (f"{fmt(interval.mean_difference)} "
            f"[{fmt(interval.low)}, {fmt(interval.high)}]")
