"""Paired statistics over rollout steps (stdlib + numpy; no scipy).

For each step s with the same trajectories in both arms, the paired change is
``t_arm[s] / t_base[s] - 1``. We report its median, a percentile bootstrap
confidence interval of that median, an exact two-sided sign test and a
Wilcoxon signed-rank test (normal approximation with tie correction).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


Samples = Sequence[float] | np.ndarray


def paired_changes(arm: Sequence[float], base: Sequence[float]) -> np.ndarray:
    a, b = np.asarray(arm, float), np.asarray(base, float)
    if a.shape != b.shape:
        raise ValueError("paired samples must have the same length")
    return a / b - 1.0


def bootstrap_median_ci(x: Samples, level: float = 0.95, resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    v = np.asarray(x, float)
    if len(v) == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    meds = np.median(v[rng.integers(0, len(v), (resamples, len(v)))], axis=1)
    lo, hi = np.quantile(meds, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def sign_test(x: Samples) -> float:
    """Exact two-sided sign test p-value of median(x) == 0 (zeros dropped)."""
    v = np.asarray(x, float)
    pos, neg = int((v > 0).sum()), int((v < 0).sum())
    n = pos + neg
    if n == 0:
        return 1.0
    k = min(pos, neg)
    p = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * p)


def wilcoxon(x: Samples) -> float:
    """Two-sided Wilcoxon signed-rank p-value (normal approximation, tie-corrected; zeros dropped)."""
    v = np.asarray(x, float)
    v = v[v != 0]
    n = len(v)
    if n == 0:
        return 1.0
    absx = np.abs(v)
    order = np.argsort(absx, kind="mergesort")
    ranks = np.empty(n)
    sorted_abs = absx[order]
    i = 0
    tie_term = 0.0
    while i < n:
        j = i
        while j + 1 < n and sorted_abs[j + 1] == sorted_abs[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        t = j - i + 1
        tie_term += t**3 - t
        i = j + 1
    w_plus = ranks[v > 0].sum()
    mean = n * (n + 1) / 4
    var = n * (n + 1) * (2 * n + 1) / 24 - tie_term / 48
    if var <= 0:
        return 1.0
    z = (abs(w_plus - mean) - 0.5) / math.sqrt(var)  # continuity correction
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def summarize(arm: Sequence[float], base: Sequence[float], seed: int = 0) -> dict[str, float]:
    ch = paired_changes(arm, base)
    lo, hi = bootstrap_median_ci(ch, seed=seed)
    return {
        "median": float(np.median(ch)) if len(ch) else math.nan,
        "ci_low": lo,
        "ci_high": hi,
        "sign_p": sign_test(ch),
        "wilcoxon_p": wilcoxon(ch),
        "wins": int((ch < 0).sum()),
        "n": int(len(ch)),
    }
