"""Wall-clock timing with warm-up, repeats, median and spread; synchronised on CUDA."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch


@dataclass
class Timing:
    """Seconds per call over ``repeats`` calls after ``warmup`` calls."""

    median: float
    q25: float
    q75: float
    minimum: float
    repeats: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_samples(cls, times: list[float]) -> Timing:
        """Median, quartiles and minimum of ``times`` (seconds, at least one)."""
        qs = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
        return cls(statistics.median(times), qs[0], qs[2], min(times), len(times))


def sync(device: torch.device | str | None) -> None:
    """Wait for the device's queued work (CUDA); a no-op on CPU."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_callable(
    fn: Callable[[], object],
    *,
    warmup: int = 2,
    repeats: int = 5,
    device: torch.device | str | None = None,
    budget_s: float | None = None,
) -> Timing:
    """Time ``fn()``; stops early (at least 1 repeat) once ``budget_s`` seconds have been spent."""
    for _ in range(warmup):
        fn()
    sync(device)
    times: list[float] = []
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        if budget_s is not None and time.perf_counter() - start > budget_s:
            break
    return Timing.from_samples(times)
