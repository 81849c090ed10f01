"""Percentiles for the benchmarks: one definition, so their p50/p95/p99 figures compare."""

from __future__ import annotations


def percentile(xs: list[float], p: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default); any number of samples."""
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
