"""Paired statistics over rollout steps (stdlib + numpy; no scipy).

For each step s with the same trajectories in both arms, the paired change is
``t_arm[s] / t_base[s] - 1``. We report its median, an exact distribution-free
confidence interval of that median (order statistics: the sign test inverted),
an exact two-sided sign test and a Wilcoxon signed-rank test (normal
approximation with tie correction).

The interval ``[x_(k), x_(n+1-k)]`` of the sorted changes covers the median m
of their distribution with probability exactly
``1 - 2 * P(Binomial(n, 1/2) <= k - 1)`` for any continuous distribution: m
falls below x_(k) only if fewer than k of the n draws lie below m, and each
draw does with probability 1/2, independently. The steps are independent
draws (seeds), so the changes are i.i.d.; the interval speaks of the
distribution of one step's change under this model and its workload sampling,
not of the model's error. Attainable coverages are discrete (n = 6: 96.9%
for [min, max]; n = 8: 99.2%, or 93.0% for the 2nd and 7th); the largest k whose
coverage reaches the level is used, and the exact coverage is reported.
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


def median_ci_coverage(n: int, k: int) -> float:
    """Exact probability that ``[x_(k), x_(n+1-k)]`` (1-based order statistics of n i.i.d. draws) covers the median."""
    if not 1 <= k <= (n + 1) // 2:
        raise ValueError(f"k must be in 1..{(n + 1) // 2} for n={n}, got {k}")
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2**n


def median_ci(x: Samples, level: float = 0.95) -> tuple[float, float, float]:
    """Distribution-free CI of the median: ``(low, high, exact coverage)``.

    The narrowest order-statistic interval whose coverage is at least ``level``;
    with too few samples for ``level`` ([min, max] covers less), [min, max] and its
    lower coverage are returned, so the caller always reports what it got.
    """
    v = np.sort(np.asarray(x, float))
    n = len(v)
    if n == 0:
        return (math.nan, math.nan, 0.0)
    k = 1
    while k + 1 <= (n + 1) // 2 and median_ci_coverage(n, k + 1) >= level:
        k += 1
    return float(v[k - 1]), float(v[n - k]), median_ci_coverage(n, k)


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


def summarize(arm: Sequence[float], base: Sequence[float]) -> dict[str, float]:
    ch = paired_changes(arm, base)
    lo, hi, coverage = median_ci(ch)
    return {
        "median": float(np.median(ch)) if len(ch) else math.nan,
        "ci_low": lo,
        "ci_high": hi,
        "coverage": coverage,
        "sign_p": sign_test(ch),
        "wilcoxon_p": wilcoxon(ch),
        "wins": int((ch < 0).sum()),
        "n": int(len(ch)),
    }
