"""The benchmarks' one clock: device synchronization, timed calls with their percentiles, CUDA-event timing, stopwatches
and peak memory, so every benchmark measures the same way.

Times are host wall-clock seconds around work the device has finished (``sync`` before reading the clock), except
``event_median_ms``, which reads CUDA events (the device's own clock: no host overhead in the figure).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

Device = torch.device | str | None  # None: the current CUDA device when there is one, else the CPU


def on_cuda(device: Device = None) -> bool:
    """Whether ``device`` is a CUDA device (``None``: whether CUDA is available)."""
    return torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"


def sync(device: Device = None) -> None:
    """Wait until the device has run everything queued (a no-op on the CPU), so the next clock reading counts it."""
    if on_cuda(device):
        torch.cuda.synchronize(None if device is None else torch.device(device))


def reset_peak_memory(device: Device = None) -> None:
    """Start a new peak-memory window on CUDA (nothing on the CPU)."""
    if on_cuda(device):
        torch.cuda.reset_peak_memory_stats(None if device is None else torch.device(device))


def peak_memory_gib(device: Device = None, held_bytes: int = 0) -> float | None:
    """Peak CUDA memory allocated since the last reset, above ``held_bytes`` (GiB, 3 decimals); None on the CPU."""
    if not on_cuda(device):
        return None
    peak = torch.cuda.max_memory_allocated(None if device is None else torch.device(device))
    return round((peak - held_bytes) / 2**30, 3)


def peak_reserved_gib(device: Device = None) -> float | None:
    """Peak CUDA memory held by the caching allocator since the last reset (GiB, 3 decimals); None on the CPU."""
    if not on_cuda(device):
        return None
    return round(torch.cuda.max_memory_reserved(None if device is None else torch.device(device)) / 2**30, 3)


def process_peak_rss_gib() -> float:
    """This process's peak resident memory so far (GiB): the CPU's stand-in for a GPU's peak allocation."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def percentiles_ms(times_ms: list[float], digits: int = 3) -> dict[str, Any]:
    """Median, 10th and 90th percentile and mean of ``times_ms``, rounded to ``digits``, and how many there were."""
    ordered = sorted(times_ms)
    return {"median_ms": round(statistics.median(ordered), digits), "p10_ms": round(ordered[len(ordered) // 10], digits),
            "p90_ms": round(ordered[(len(ordered) * 9) // 10], digits), "mean_ms": round(statistics.fmean(ordered), digits),
            "steps": len(ordered)}


def time_calls(fn: Callable[[], object], device: Device, steps: int, warmup: int = 3, time_left_s: float = float("inf"),
               min_steps: int = 3, digits: int = 3) -> dict[str, Any]:
    """Call ``fn`` ``warmup`` times untimed (compilation, autotuning, lazy set-up), then time up to ``steps`` calls one
    by one, the device synchronized after each; once ``time_left_s`` since the start has passed, stop after
    ``min_steps``. Returns ``percentiles_ms`` of the timed calls, ``warmup_s`` and, on CUDA, their ``peak_mem_gib``."""
    started = time.perf_counter()
    for _ in range(warmup):
        fn()
    sync(device)
    warmup_s = time.perf_counter() - started
    reset_peak_memory(device)
    times: list[float] = []
    while len(times) < steps and (len(times) < min_steps or time.perf_counter() - started < time_left_s):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1000)
    record = {**percentiles_ms(times, digits), "warmup_s": round(warmup_s, 1)}
    peak = peak_memory_gib(device)
    if peak is not None:
        record["peak_mem_gib"] = peak
    return record


def event_median_ms(fn: Callable[[], object], reps: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn`` on the current CUDA stream by CUDA events (device time only), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


class Stopwatch:
    """Synchronized wall time of a stretch of work: ``with Stopwatch(device) as clock: ...`` then ``clock.seconds``;
    ``lap()`` inside gives the seconds since the start (synchronized too)."""

    def __init__(self, device: Device = None) -> None:
        self.device, self.seconds, self._start = device, 0.0, 0.0

    def __enter__(self) -> Stopwatch:
        sync(self.device)
        self._start = time.perf_counter()
        return self

    def lap(self) -> float:
        sync(self.device)
        return time.perf_counter() - self._start

    def __exit__(self, *exc: Any) -> None:
        self.seconds = self.lap()
