"""Paired percentile bootstrap of a mean per-query difference (Efron & Tibshirani 1993,
ch. 13; Koehn 2004), and of a difference of whole-sample statistics (ROC-AUC, AP) with
class-stratified resampling."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

_MAX_ENTRIES = 1 << 22  # resampled entries held at once by default (a few 32 MB arrays)


@dataclasses.dataclass(frozen=True)
class BootstrapInterval:
    """``mean(a - b)`` and the ``(1 -/+ confidence) / 2`` quantiles ``low <= high`` of its
    ``num_samples`` resampled means."""

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


def _samples_confidence(num_samples, confidence) -> tuple[int, float]:
    num_samples = _positive_int(num_samples, "num_samples")
    if not isinstance(confidence, (int, float, np.floating)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    return num_samples, float(confidence)


def _interval(point: float, samples: np.ndarray, confidence: float, shift: float = 0.0
              ) -> BootstrapInterval:
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(samples, [alpha, 1.0 - alpha])
    return BootstrapInterval(mean_difference=float(point), low=float(shift + low),
                             high=float(shift + high), num_samples=samples.size,
                             confidence=confidence)


def paired_bootstrap(a, b, *, num_samples: int = 10_000, confidence: float = 0.95, seed: int = 0,
                     chunk_size: int | None = None) -> BootstrapInterval:
    """Percentile interval (as ``scipy.stats.bootstrap(..., method='percentile')``) of
    ``mean(a - b)`` over ``[n_queries]`` paired scores, whatever ``chunk_size``.
    Raises: ValueError: ``a`` or ``b`` not 1-D, empty, non-numeric or not finite; other
    lengths; ``confidence`` outside (0, 1); non-positive ``num_samples`` or ``chunk_size``."""
    a_arr, b_arr = _per_query(a, "a"), _per_query(b, "b")
    if a_arr.shape != b_arr.shape:
        raise ValueError(f"a and b must have the same length (paired queries), got "
                         f"{a_arr.size} and {b_arr.size}")
    num_samples, confidence = _samples_confidence(num_samples, confidence)
    n = a_arr.size
    chunk = (max(1, _MAX_ENTRIES // n) if chunk_size is None
             else _positive_int(chunk_size, "chunk_size"))
    # Resample the differences relative to one of them: a constant difference then gives
    # exactly 0 deviations (so exactly [c, c]); it also avoids cancellation for large values.
    with np.errstate(over="ignore", invalid="ignore"):
        diff = a_arr - b_arr
        shift = diff[0]
        centred = diff - shift
    if not np.isfinite(centred).all() or not np.isfinite(centred.sum()):
        raise ValueError("a - b overflows float64 (values near 1e308); rescale the scores")
    rng = np.random.default_rng(seed)
    means = np.empty(num_samples, dtype=np.float64)
    for start in range(0, num_samples, chunk):
        rows = min(chunk, num_samples - start)
        # Uniform doubles, not rng.integers (which buffers 32-bit draws per call, so its
        # stream would depend on the chunking).
        u = rng.random((rows, n))
        u *= n
        idx = u.astype(np.intp)
        del u
        np.minimum(idx, n - 1, out=idx)  # u * n can round up to n for u just below 1
        means[start : start + rows] = centred[idx].mean(axis=1)
    return _interval(shift + centred.mean(), means, confidence, shift)


def _seed_columns(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name} must be [n] or [n, seeds], got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape}): no items or no seed columns")
    cols = arr.reshape(arr.shape[0], -1).T  # [seeds, n]
    return np.stack([_per_query(c, name) for c in cols])


def paired_bootstrap_statistic(statistic: Callable[[np.ndarray, np.ndarray], np.ndarray],
                               a, b, labels, *, num_samples: int = 10_000,
                               confidence: float = 0.95, seed: int = 0,
                               chunk_size: int | None = None) -> BootstrapInterval:
    """Percentile interval of ``S(a) - S(b)``, ``S`` the mean over seed columns of ``[n]``
    or ``[n, seeds]`` scores of ``statistic(scores [n], labels [n], sample_weight=counts
    [B, n]) -> [B]`` (``metrics.roc_auc_rows``); resampled within each class (pROC's
    default), the same items for every seed and both systems, whatever ``chunk_size``.
    Raises: ValueError: as :func:`paired_bootstrap`; labels of another length or one class."""
    a_arr, b_arr = _seed_columns(a, "a"), _seed_columns(b, "b")
    y = np.asarray(labels)
    n = a_arr.shape[1]
    if b_arr.shape[1] != n or y.shape != (n,):
        raise ValueError(f"a [n(, seeds)], b and labels [n] must share n, got {a_arr.shape[1]}, "
                         f"{b_arr.shape[1]} and labels of shape {y.shape}")
    if y.dtype != np.bool_ and not (np.issubdtype(y.dtype, np.number)
                                    and np.isin(y, (0, 1)).all()):
        shown = np.unique(y[~np.isin(y, (0, 1))])[:3] if y.dtype.kind in "biuf" else y.dtype
        raise ValueError(f"labels must be bool or 0/1, got {shown}")
    y = y.astype(bool)
    if y.all() or not y.any():
        raise ValueError("labels need both classes")
    num_samples, confidence = _samples_confidence(num_samples, confidence)
    chunk = (max(1, _MAX_ENTRIES // (8 * n)) if chunk_size is None
             else _positive_int(chunk_size, "chunk_size"))
    groups = (np.flatnonzero(y), np.flatnonzero(~y))

    def s_of(x: np.ndarray, counts: np.ndarray) -> np.ndarray:  # x [seeds, n], counts [B, n]
        return np.mean([statistic(col, y, sample_weight=counts) for col in x], axis=0)

    rng = np.random.default_rng(seed)
    diffs = np.empty(num_samples, dtype=np.float64)
    for start in range(0, num_samples, chunk):
        rows = min(chunk, num_samples - start)
        # One [rows, n] draw (as paired_bootstrap: chunking-independent), its first
        # columns picking positives and the rest negatives.
        u = rng.random((rows, n))
        idx = np.empty((rows, n), dtype=np.intp)
        lo = 0
        for g in groups:
            cols = slice(lo, lo + g.size)
            idx[:, cols] = g[np.minimum((u[:, cols] * g.size).astype(np.intp), g.size - 1)]
            lo += g.size
        counts = np.bincount((idx + n * np.arange(rows)[:, None]).ravel(),
                             minlength=rows * n).reshape(rows, n)
        diffs[start:start + rows] = s_of(a_arr, counts) - s_of(b_arr, counts)
    whole = np.ones((1, n))
    return _interval(s_of(a_arr, whole)[0] - s_of(b_arr, whole)[0], diffs, confidence)


def format_interval(interval: BootstrapInterval, scale: float = 100, digits: int = 2) -> str:
    """``"+1.23 [-0.45, +2.87]"``: the interval times ``scale`` (100: points), signed."""

    def fmt(x: float) -> str:
        return f"{scale * x:+.{digits}f}"

    return f"{fmt(interval.mean_difference)} [{fmt(interval.low)}, {fmt(interval.high)}]"
