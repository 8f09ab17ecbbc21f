"""Rates per second of the last minutes, for the console's charts.

Sampled only while a console is open (nothing runs otherwise), and kept after it closes,
so a console opened again shows the minutes watched before, with the gap as a gap."""

from __future__ import annotations

from collections import deque
from typing import Any

Counts = dict[str, dict[str, float]]


class RateHistory:
    """The last ``length`` samples of every service's rates (per second, from cumulative
    counters); a counter that went down (a restarted service) gives no rate that once."""

    def __init__(self, length: int = 300) -> None:
        self.samples: deque[dict[str, Any]] = deque(maxlen=length)
        self._previous: tuple[float, Counts] | None = None

    def add(self, now: float, counts: Counts, gap_after: float) -> dict[str, Any]:
        """The sample of ``counts`` at ``now``, appended; against a previous sample older
        than ``gap_after`` seconds it starts a new run (no rate across the gap)."""
        previous, self._previous = self._previous, (now, counts)
        rates: dict[str, dict[str, float]] = {}
        if previous is not None and 0 < now - previous[0] <= gap_after:
            then, before = previous
            elapsed = now - then
            for service, values in counts.items():
                earlier = before.get(service, {})
                rates[service] = {
                    label: round((value - earlier[label]) / elapsed, 3)
                    for label, value in values.items()
                    if label in earlier and value >= earlier[label]
                }
        sample = {"t": round(now, 3), "rates": rates}
        self.samples.append(sample)
        return sample

    def recent(self) -> list[dict[str, Any]]:
        """The samples kept, oldest first."""
        return list(self.samples)
