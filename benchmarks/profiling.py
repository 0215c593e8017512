"""Where a GPU step's time goes: torch.profiler over a few steps, summarized for one JSON record.

``ProfiledSteps`` profiles the steps run inside it and records every synchronizing CUDA call with the
Python lines that made it, innermost first, four frames deep (``torch.cuda.set_sync_debug_mode``).
``summary(n)`` gives: wall and GPU-busy milliseconds per step (busy = union of kernel intervals, so
busy << wall means the step is bound by the host: launches, Python, syncs), CUDA runtime calls per step,
sync sites, and the top kernels and CPU ops.
"""

from __future__ import annotations

import importlib.util
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from benchmarks.timing import sync

RUNTIME_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync",
                 "cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")


def build_gsplat_kernels() -> float:
    """Build (or load) gsplat's CUDA kernels now, before any clock starts, and return the seconds it took (0 without
    CUDA or gsplat). Its JIT build takes minutes on a fresh machine, and again wherever its installed files are newer
    than the build (a machine that reinstalls its wheels before each run): inside a training clock it swamps it."""
    if not torch.cuda.is_available() or importlib.util.find_spec("gsplat") is None:
        return 0.0
    start = time.perf_counter()
    import gsplat.cuda._backend  # noqa: F401  (importing builds or loads the extension)

    return round(time.perf_counter() - start, 1)


class ProfiledSteps:
    """Context manager: profile (CPU + CUDA) and catch sync warnings; ``summary(n_steps)`` afterwards."""

    def __init__(self, stacks: bool = False) -> None:
        self.stacks = stacks  # also record shapes and Python stacks: summary names the ops behind the device time
        self.profiler: Any = None
        self.syncs: dict[str, int] = {}
        self.wall_s = 0.0
        self._catcher: Any = None
        self._started = 0.0

    def __enter__(self) -> ProfiledSteps:
        sync()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        # without verbose, key_averages(group_by_stack_n=...) has empty stacks
        verbose = torch._C._profiler._ExperimentalConfig(verbose=True) if self.stacks else None
        self.profiler = torch.profiler.profile(activities=activities, record_shapes=self.stacks, with_stack=self.stacks,
                                               experimental_config=verbose)
        self.profiler.__enter__()
        self._catcher = warnings.catch_warnings()
        self._catcher.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._record_sync  # restored by the catcher
        torch.cuda.set_sync_debug_mode("warn")
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        sync()
        self.wall_s = time.perf_counter() - self._started
        torch.cuda.set_sync_debug_mode("default")
        self._catcher.__exit__(None, None, None)
        self.profiler.__exit__(None, None, None)

    def _record_sync(self, message: Any, category: Any, filename: str, lineno: int, *args: Any) -> None:
        """A warning's hook: for a sync warning, count its call site with the three frames above it."""
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "warnings" not in Path(f.filename).name]
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames[-4:]))
        self.syncs[where] = self.syncs.get(where, 0) + 1

    def summary(self, n: int) -> dict[str, Any]:
        """Per-step figures over the ``n`` profiled steps."""
        # kernels and copies only: user annotations (e.g. Lightning's "Optimizer.step#Adam.step", which spans the
        # whole closure) also appear on the GPU timeline and would count the idle gaps between kernels as busy
        intervals = sorted((e.time_range.start, e.time_range.end) for e in self.profiler.events()
                           if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False))
        busy, end = 0.0, float("-inf")
        for a, b in intervals:
            if b > end:
                busy += b - max(a, end)
                end = b
        averages = self.profiler.key_averages()
        kernels = sorted((e for e in averages if e.self_device_time_total > 0 and not getattr(e, "is_user_annotation", False)),
                         key=lambda e: -e.self_device_time_total)
        cpu_ops = sorted(averages, key=lambda e: -e.self_cpu_time_total)
        runtime = {e.key: (e.count, e.cpu_time_total) for e in averages if e.key in RUNTIME_CALLS}
        record = {
            "profiled_steps": n,
            "wall_ms_per_step": round(self.wall_s * 1000 / n, 2),  # includes the profiler's own overhead
            "gpu_busy_ms_per_step": round(busy / 1000 / n, 2),
            "cuda_runtime_per_step": {k: {"calls": round(c / n, 1), "cpu_ms": round(t / 1000 / n, 3)}
                                      for k, (c, t) in runtime.items()},
            "sync_sites_per_step": {k: round(v / n, 2) for k, v in sorted(self.syncs.items(), key=lambda kv: -kv[1])[:12]},
            "top_kernels_ms_per_step": [[e.key[:90], round(e.self_device_time_total / 1000 / n, 3)] for e in kernels[:15]],
            "top_cpu_ops_ms_per_step": [[e.key[:90], round(e.self_cpu_time_total / 1000 / n, 3)] for e in cpu_ops[:15]],
        }
        if self.stacks:
            record["top_device_ops_by_stack"] = self._ops_by_stack(n)
            backward = sorted((e for e in averages if e.key.startswith("autograd::engine::evaluate_function")),
                              key=lambda e: -e.device_time_total)  # inclusive: a backward node and the kernels it ran
            record["top_backward_nodes_ms_per_step"] = [[e.key.split(": ", 1)[-1], round(e.device_time_total / 1000 / n, 3)]
                                                        for e in backward[:10]]
        return record

    def _ops_by_stack(self, n: int, top: int = 12) -> list[dict[str, Any]]:
        """The aten ops that launched the most device time, each with its input shapes and the project lines above it."""
        grouped = self.profiler.key_averages(group_by_input_shape=True, group_by_stack_n=8)
        ops = sorted((e for e in grouped if e.key.startswith("aten::") and e.device_time_total > 0),
                     key=lambda e: -e.self_device_time_total)
        return [{"op": e.key, "device_ms_per_step": round(e.self_device_time_total / 1000 / n, 3),
                 "calls_per_step": round(e.count / n, 1), "shapes": str(e.input_shapes)[:160],
                 "stack": [f for f in e.stack if "lift3d" in f or "benchmarks" in f][:5]}
                for e in ops[:top]]


class ProfileWindow(Callback):
    """Profiles ``n`` training steps starting after ``start`` steps (a ``ProfiledSteps`` window)."""

    def __init__(self, start: int, n: int, stacks: bool = False) -> None:
        self.start, self.n, self.stacks = start, n, stacks
        self.window: ProfiledSteps | HostProfile | None = None
        self.summary: dict[str, Any] | None = None

    def profiler(self) -> ProfiledSteps | HostProfile:
        return ProfiledSteps(self.stacks)

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.start and self.window is None:
            self.window = self.profiler().__enter__()

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.window is not None and self.summary is None and trainer.global_step >= self.start + self.n:
            self.window.__exit__(None, None, None)
            self.summary = self.window.summary(self.n)


class HostProfile:
    """cProfile over a stretch of steps (no CUDA profiler, no sync checks): where a host-bound step's Python time
    goes. ``summary(n)`` gives wall ms per step and the functions with the most own and cumulative time per step."""

    def __init__(self) -> None:
        import cProfile

        self.profile = cProfile.Profile()
        self.wall_s = 0.0
        self._started = 0.0

    def __enter__(self) -> HostProfile:
        sync()
        self._started = time.perf_counter()
        self.profile.enable()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.profile.disable()
        sync()
        self.wall_s = time.perf_counter() - self._started

    def summary(self, n: int, top: int = 25) -> dict[str, Any]:
        import pstats

        stats = pstats.Stats(self.profile).stats  # {(file, line, name): (calls, ncalls, tottime, cumtime, callers)}

        def label(key: tuple) -> str:
            file, line, name = key
            return f"{'/'.join(Path(file).parts[-2:])}:{line}({name})" if line else name

        by_own = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
        by_cum = sorted(stats.items(), key=lambda kv: -kv[1][3])[:top * 2]
        return {
            "host_profiled_steps": n,
            "host_wall_ms_per_step": round(self.wall_s * 1000 / n, 3),
            "own_ms_per_step": [[label(k), round(v[2] * 1000 / n, 3), round(v[1] / n, 1)] for k, v in by_own],
            "cumulative_ms_per_step": [[label(k), round(v[3] * 1000 / n, 3)] for k, v in by_cum],
        }


class HostProfileWindow(ProfileWindow):
    """cProfile of ``n`` training steps from step ``start`` (see ``HostProfile``)."""

    def profiler(self) -> HostProfile:
        return HostProfile()


class StageTimer(Callback):
    """Seconds from the first training step's start to the last one's end (the device synchronized at both), and the
    step count: a stage's training time as its user waits for it."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.seconds, self.steps = 0.0, 0

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if self.start is None:
            sync()
            self.start = time.perf_counter()

    def on_train_end(self, trainer: Any, module: Any) -> None:
        sync()
        self.seconds, self.steps = time.perf_counter() - (self.start or time.perf_counter()), trainer.global_step


class StepTimes(Callback):
    """Every training step's time, the device synchronized at each step's end (a diagnostic run: the host cannot
    queue ahead). ``summary()`` splits the steps into ordinary ones (median by thousand steps, with the Gaussian
    count, where the model has one) and the slow ones (more than 3x the median: captures, densification), so the
    cost of each is known."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.sizes: dict[int, int] = {}
        self._last = 0.0

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if not self._last:
            sync()
            self._last = time.perf_counter()
        if trainer.global_step % 1000 == 0 and hasattr(module, "gaussians"):
            self.sizes[trainer.global_step] = len(module.gaussians)

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        sync()
        now = time.perf_counter()
        self.times.append(now - self._last)
        self._last = now

    def summary(self) -> dict[str, Any]:
        times = torch.tensor(self.times[1:], dtype=torch.float64) * 1000  # the first step builds kernels
        median = float(times.median())
        slow = times > 3 * median
        by_thousand = [round(float(times[i:i + 1000].median()), 3) for i in range(0, len(times), 1000)]
        return {"steps": len(times), "total_s": round(float(times.sum()) / 1000, 2), "median_ms": round(median, 3),
                "median_ms_by_thousand": by_thousand, "gaussians_by_thousand": list(self.sizes.values()),
                "slow_steps": int(slow.sum()), "slow_total_s": round(float(times[slow].sum()) / 1000, 2),
                "slow_median_ms": round(float(times[slow].median()), 1) if bool(slow.any()) else 0.0,
                "ordinary_total_s": round(float(times[~slow].sum()) / 1000, 2)}
