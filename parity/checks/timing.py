"""Time ratios that say when they are noise: paired ratios, their median and [min-max] spread.

A step-time ratio measured on a shared machine means something only when its spread is narrower
than the effect it reports. :func:`ratio_spread` turns interleaved step times (A B A B ..., one
pair per round) into the median of the per-round ratios with their minimum and maximum;
:attr:`RatioSpread.noise` is True when the spread (max - min) is wider than the median's distance
from 1, and :meth:`RatioSpread.text` then shows ``noise`` instead of a bare ratio. The command that
measures step times properly (pinned, interleaved, >= 7 rounds) is :data:`MEASURE_COMMAND`
(docs/time.md).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from typing import Sequence

__all__ = ["MEASURE_COMMAND", "RatioSpread", "load_average_1min", "paired_ratios", "ratio_between", "ratio_spread"]

MEASURE_COMMAND = "python scripts/bench_overhead.py"
"""The benchmark that measures remat's time overhead with spread (docs/time.md)."""


@dataclasses.dataclass(frozen=True)
class RatioSpread:
    """The median of paired time ratios and their spread.

    Attributes:
        median: median of the per-round ratios (dimensionless; 1.25 = 25% slower than the reference).
        low: smallest per-round ratio.
        high: largest per-round ratio.
        rounds: how many rounds (pairs) the ratio is taken over.
    """

    median: float
    low: float
    high: float
    rounds: int

    @property
    def spread(self) -> float:
        """``high - low``: how far apart the rounds landed."""
        return self.high - self.low

    @property
    def noise(self) -> bool:
        """True when the spread is wider than the effect (``high - low > |median - 1|``), or one round only."""
        return self.rounds < 2 or self.spread > abs(self.median - 1.0)

    def text(self, digits: int = 2) -> str:
        """``1.27x [1.21-1.35]``, or ``noise (1.03x [0.91-1.20])`` when :attr:`noise`."""
        core = f"{self.median:.{digits}f}x [{self.low:.{digits}f}-{self.high:.{digits}f}]"
        return f"noise ({core})" if self.noise else core

    def as_dict(self) -> dict:
        """``{"median", "min", "max", "rounds", "noise"}`` for a JSON report."""
        return {"median": self.median, "min": self.low, "max": self.high, "rounds": self.rounds, "noise": self.noise}


def paired_ratios(times_s: Sequence[float], reference_s: Sequence[float]) -> list[float]:
    """Per-round ratios ``times_s[i] / reference_s[i]`` of two interleaved series (seconds).

    Raises:
        ValueError: the series differ in length, are empty, or a reference time is not positive.
    """
    if len(times_s) != len(reference_s) or not times_s:
        raise ValueError(f"paired ratios need two non-empty series of one length, got {len(times_s)} and "
                         f"{len(reference_s)} times")
    if any(r <= 0 for r in reference_s):
        raise ValueError(f"reference times must be positive seconds, got {list(reference_s)}")
    return [t / r for t, r in zip(times_s, reference_s)]


def ratio_spread(times_s: Sequence[float], reference_s: Sequence[float]) -> RatioSpread:
    """Median and [min-max] of :func:`paired_ratios` (one ratio per round of an interleaved run).

    Raises:
        ValueError: as :func:`paired_ratios`.
    """
    ratios = paired_ratios(times_s, reference_s)
    return RatioSpread(float(statistics.median(ratios)), float(min(ratios)), float(max(ratios)), len(ratios))


def load_average_1min() -> float | None:
    """The machine's 1-minute load average (``os.getloadavg``), None where the platform has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def ratio_between(ratio: float, ratio_range, other: float, other_range) -> RatioSpread:
    """``ratio / other`` of two step-time ratios to the same reference (e.g. two plans' time over ``none``'s),
    its spread the widest their ranges allow: ``[low / other's high, high / other's low]``.

    Without both ranges it counts one round, so :attr:`RatioSpread.noise` is True: a comparison whose
    spread is unknown decides nothing.

    Raises:
        ValueError: a ratio or a range bound that is not positive.
    """
    if not ratio > 0 or not other > 0:
        raise ValueError(f"time ratios must be positive, got {ratio!r} and {other!r}")
    if not ratio_range or not other_range:
        return RatioSpread(ratio / other, ratio / other, ratio / other, 1)
    (lo, hi), (olo, ohi) = (tuple(map(float, r)) for r in (ratio_range, other_range))
    if min(lo, hi, olo, ohi) <= 0:
        raise ValueError(f"time ratio ranges must be positive, got {ratio_range!r} and {other_range!r}")
    return RatioSpread(ratio / other, lo / ohi, hi / olo, 2)
