"""Arithmetic floors for the benchmark suite: FLOPs of one step and the matmul rate of this device.

``floor_ms = FLOPs / rate``: the time the step would take if every FLOP ran at the speed of one large
matmul in the step's precision (fp16, bf16, or fp32 through TF32 tensor cores). FLOPs come from
``torch.utils.flop_counter.FlopCounterMode`` over one eager step, so they count matmuls, convolutions
and attention only (elementwise work, gathers and custom kernels count zero: for such steps the floor
is a loose lower bound, and the table says so with ``x_floor`` far above 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from benchmarks.timing import sync

PRECISIONS = ("fp16", "bf16", "tf32", "fp32")


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of one call of ``fn`` (matmul, convolution, attention; forward and backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def matmul_rate(precision: str, device: torch.device, n: int, repeats: int = 10) -> float:
    """Measured FLOP/s of an [n,n] @ [n,n] matmul in ``precision`` (best of ``repeats`` after a warm-up).

    ``tf32`` is fp32 with TF32 tensor cores allowed (torch's matmul precision "high"); ``fp32`` is strict."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got '{precision}'")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    if device.type == "cpu" and dtype != torch.float32:
        dtype = torch.float32  # half matmuls on a CPU are emulated: the fp32 rate is the honest floor there
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        g = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
        out = torch.empty(n, n, device=device, dtype=dtype)
        torch.mm(a, b, out=out)
        sync(device)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            sync(device)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2.0 * n**3 / best


def measure_rates(device: torch.device, tiny: bool) -> dict[str, float]:
    """FLOP/s per precision on ``device`` (an 8192^3 matmul on GPUs: long enough to reach the clock limit)."""
    n = 256 if tiny else (8192 if device.type == "cuda" else 1024)
    return {p: matmul_rate(p, device, n, repeats=3 if tiny else 10) for p in PRECISIONS}


def floor_fields(flops: int | None, precision: str, rates: dict[str, float], median_ms: float | None) -> dict[str, object]:
    """``gflop``, ``floor_ms`` and ``x_floor`` (measured / floor) of a case, None where unknown."""
    if not flops or precision not in rates or not rates[precision]:
        return {"gflop": None if flops is None else round(flops / 1e9, 4), "floor_ms": None, "x_floor": None}
    floor_ms = flops / rates[precision] * 1000
    x = round(median_ms / floor_ms, 2) if median_ms and floor_ms > 0 else None
    return {"gflop": round(flops / 1e9, 4), "floor_ms": round(floor_ms, 4), "x_floor": x}
