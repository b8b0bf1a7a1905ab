# Licensed to the Apache Software Foundation (ASF) under one
# or more contributor license agreements.  See the NOTICE file
# distributed with this work for additional information
# regarding copyright ownership.  The ASF licenses this file
# to you under the Apache License, Version 2.0 (the
# "License"); you may not use this file except in compliance
# with the License.  You may obtain a copy of the License at
#
#   http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing,
# software distributed under the License is distributed on an
# "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
# KIND, either express or implied.  See the License for the
# specific language governing permissions and limitations
# under the License.
#
# NOTICE of the work this file is derived from:
#   Apache Otava (incubating)
#   Copyright 2020-2025 The Apache Software Foundation.
#   This product includes software developed at
#   The Apache Software Foundation (https://www.apache.org/).
"""E-Divisive change points with Hunter's split and merge: Apache Otava 0.8.0's
``otava.analysis.compute_change_points``, as perfsuite calls it.

Derived from otava/analysis.py and otava/change_point_divisive/ (base,
calculator, detector) of apache-otava 0.8.0. Changed: only what
``compute_change_points(series, window_len, max_pvalue, min_magnitude)``
runs is kept (no incremental detection, no permutation test, no report
formatting); the classes are folded together. The arithmetic is Otava's,
operation for operation, so the change points and p-values are the same
(``tests/unit/test_edivisive.py`` compares the two on generated series).

Why a copy: the package pins ``numpy==2.2.0`` and ``scipy<1.17`` and
brings 28 others (BigQuery, Slack, PostgreSQL clients) for these ~200 lines.

The method: "Hunter: Using Change Point Detection to Hunt for Performance
Regressions", Fleming et al. (https://doi.org/10.1145/3578244.3583719),
over E-Divisive by Matteson and James (https://doi.org/10.48550/arXiv.1306.4933).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import ttest_ind_from_stats


@dataclass
class TTestStats:
    """Two segments' means and (population) deviations, and the t-test's p-value."""

    pvalue: float
    mean_1: float
    mean_2: float
    std_1: float
    std_2: float

    def change_magnitude(self) -> float:
        """The larger of the relative changes left to right and right to left (0 where a mean is 0)."""
        forward = 0 if self.mean_1 == 0 else self.mean_2 / self.mean_1 - 1.0
        backward = 0 if self.mean_2 == 0 else self.mean_1 / self.mean_2 - 1.0
        return max(abs(forward), abs(backward))


@dataclass
class ChangePoint:
    """``series[index]`` starts a new segment; ``qhat``: the E-Divisive statistic that chose it."""

    index: int
    qhat: float
    stats: TTestStats | None = None

    def __eq__(self, other: object) -> bool:  # one point per index, whatever its statistics
        return isinstance(other, ChangePoint) and self.index == other.index


def intervals(points: list[ChangePoint]) -> list[slice]:
    """The segments between sorted change points, empty ones left out."""
    assert all(points[i].index <= points[i + 1].index for i in range(len(points) - 1)), \
        "Change points must be sorted by index"
    spans = [slice(0 if i == 0 else points[i - 1].index, None if i == len(points) else points[i].index)
             for i in range(len(points) + 1)]
    return [s for s in spans if s.start != s.stop]


def compare(left: Sequence[float], right: Sequence[float]) -> TTestStats:
    """Two-sided Student's t-test of two segments (Otava passes numpy's population std)."""
    if len(left) == 0 or len(right) == 0:
        raise ValueError
    mean_l, mean_r = np.mean(left), np.mean(right)
    std_l = np.std(left) if len(left) >= 2 else 0.0
    std_r = np.std(right) if len(right) >= 2 else 0.0
    if len(left) + len(right) > 2:
        _, p = ttest_ind_from_stats(mean_l, std_l, len(left), mean_r, std_r, len(right), alternative="two-sided")
    else:
        p = 1.0
    return TTestStats(mean_1=mean_l, mean_2=mean_r, std_1=std_l, std_2=std_r, pvalue=p)


def with_stats(candidate: ChangePoint, series: Sequence[float], spans: list[slice]) -> ChangePoint:
    """``candidate`` with the t-test of the segments either side: a new point splits
    the segment it lies in (split step); an existing one joins its two (merge step)."""
    for i, span in enumerate(spans):
        if span.stop == candidate.index:
            left, right = span, spans[i + 1]
            break
        if (span.start is None or span.start < candidate.index) and (span.stop is None or candidate.index < span.stop):
            left, right = slice(span.start, candidate.index), slice(candidate.index, span.stop)
            break
    else:
        raise ValueError(f"Candidate Change Point at index={candidate.index} doesn't correspond to any "
                         f"interval in {spans}.")
    return ChangePoint(candidate.index, candidate.qhat, compare(series[left], series[right]))


class PairDistances:
    """E-Divisive's statistic Q over every split of every window, from cumulative
    sums of the pairwise |x_i - x_j| (Otava's PairDistanceCalculator, power 1)."""

    def __init__(self, series: np.ndarray) -> None:
        self.series = series
        self.distances = np.power(np.abs(series[:, None] - series[None, :]), 1.0)
        triu = np.triu(self.distances, k=1)[:-1, 1:]
        self.V = triu.sum(axis=0)
        self.H = triu.cumsum(axis=1)

    def q_values(self, start: int, end: int) -> np.ndarray:
        """Q[i, j] = Q(series[start:i + 1], series[i + 1:j + 2]) for start < i + 1 < j + 2 <= end."""
        V = self.V[start:end - 1] - self.distances[0:start, start + 1:end].sum(axis=0)
        H = self.H[start:end - 1, start:end - 1]
        taus = np.arange(start + 1, end)[:, None]
        kappas = np.arange(start + 2, end + 1)[None, :]

        A = np.zeros((end - 1 - start, end - 1 - start))
        A_coefs = 2 / (kappas - start)
        A[1:, :] = np.cumsum(V)[:-1, None]
        A = A_coefs * np.triu(np.cumsum(H, axis=0) - A, k=0)

        B = np.zeros((end - 1 - start, end - 1 - start))
        B_num = 2 * (kappas - taus)
        B_den = (kappas - start) * (taus - start - 1)
        B_mask = np.triu(np.ones_like(B_den, dtype=bool), k=0)
        B_out = np.zeros_like(B_den, dtype=float)
        B_coefs = np.divide(B_num, B_den, out=B_out, where=B_mask & (B_den != 0))
        B[1:, 1:] = B_coefs[1:, 1:] * np.cumsum(V)[:-1, None]

        C = np.zeros((end - 1 - start, end - 1 - start))
        C_num = 2 * (taus - start)
        C_den = (kappas - start) * (kappas - taus - 1)
        C_mask = np.triu(np.ones_like(C_den, dtype=bool), k=1)
        C_out = np.zeros_like(C_den, dtype=float)
        C_coefs = np.divide(C_num, C_den, out=C_out, where=C_mask & (C_den != 0))
        C[:-1, 1:] = C_coefs[:-1, 1:] * np.flipud(np.cumsum(np.flipud(H[1:, 1:]), axis=0))
        return A - B - C

    def candidate(self, span: slice) -> ChangePoint:
        start = 0 if span.start is None else span.start
        end = len(self.series) if span.stop is None else span.stop
        assert end - start > 1, f"interval must be a non-empty slice, but array[{start}:{end}] was given."
        Q = self.q_values(start, end)
        i, j = np.unravel_index(np.argmax(Q), Q.shape)
        return ChangePoint(index=i + 1 + start, qhat=Q[i][j])

    def next_candidate(self, spans: list[slice]) -> ChangePoint | None:
        found = [self.candidate(s) for s in spans if len(self.series[s]) > 1]
        return max(found, key=lambda point: point.qhat) if found else None


def window_change_points(series: Sequence[float], start: int, end: int, max_pvalue: float) -> list[ChangePoint]:
    """E-Divisive on ``series[start:end]``: the best split of any segment, while its t-test is significant."""
    window = np.array(series[start:end], dtype=np.float64)
    distances = PairDistances(window)
    points: list[ChangePoint] = []
    while True:
        spans = intervals(points)
        candidate = distances.next_candidate(spans)
        if candidate is None:
            break
        point = with_stats(candidate, window, spans)
        if not point.stats.pvalue <= max_pvalue:  # a NaN p-value ends it too
            break
        points.append(point)
        points.sort(key=lambda p: p.index)
    for point in points:
        point.index += start
    return points


def split(series: Sequence[float], window_len: int, max_pvalue: float) -> list[ChangePoint]:
    """Hunter's split step: E-Divisive in windows sliding by half a window; the union of their points."""
    assert window_len >= 2, "Window length must be at least 2"
    start, step = 0, int(window_len / 2)
    points: list[ChangePoint] = []
    while start < len(series):
        end = min(start + window_len, len(series))
        found = window_change_points(series, start, end, max_pvalue)
        start = max(found[-1].index if found else 0, start + step)
        for point in found:
            if point not in points:  # a window's point that the window before found too
                points.append(point)
    points.sort(key=lambda p: p.index)
    spans = intervals(points)
    return [with_stats(p, series, spans) for p in points]


def merge(points: list[ChangePoint], series: Sequence[float], max_pvalue: float,
          min_magnitude: float) -> list[ChangePoint]:
    """Hunter's merge step: drop the weakest point (highest p-value; once all pass, the
    smallest change) until every point passes both, re-testing its neighbours each time."""
    while points:
        weakest = max(points, key=lambda c: c.stats.pvalue)
        if weakest.stats.pvalue < max_pvalue:
            weakest = min(points, key=lambda c: c.stats.change_magnitude())
            if weakest.stats.change_magnitude() > min_magnitude:
                return points
        at = points.index(weakest)
        del points[at]
        spans = intervals(points)
        for index in (at, at + 1):
            if 0 <= index < len(points):
                points[index] = with_stats(points[index], series, spans)
    return points


def compute_change_points(series: Sequence[float], window_len: int = 50, max_pvalue: float = 0.001,
                          min_magnitude: float = 0.0) -> list[ChangePoint]:
    """The change points of ``series`` (a list), sorted by index. The split step
    keeps "weak" points at a relaxed p-value (10x below 0.05), the merge step
    keeps those that pass ``max_pvalue`` or change by more than ``min_magnitude``."""
    first_pass = max_pvalue * 10 if max_pvalue < 0.05 else (max_pvalue * 2 if max_pvalue < 0.5 else max_pvalue)
    return merge(split(series, window_len, first_pass), series, max_pvalue, min_magnitude)
