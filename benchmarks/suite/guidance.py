"""Time one SDS step and one VSD step of lift3d's Stable Diffusion guidance, eager vs speed options.

The UNet and VAE have Stable Diffusion 2.1-base's architecture (``stand_ins.architectures``: nothing is downloaded)
with random weights: the same compute as the real model. An SDS step is VAE encode forward + backward at 512x512 and
one UNet call on the CFG batch of 2 at 64x64 latents; a VSD step adds the LoRA estimate and one LoRA training step.
Prints one JSON line per case, then a summary line comparing the fastest SDS case with the eager baseline.

    python -m benchmarks guidance                 # on a CUDA GPU, minutes (compiles)
    python -m benchmarks guidance --cases sds-eager,sds-channels-last
    python -m benchmarks guidance --tiny          # smoke test of the benchmark on a CPU
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from typing import Any

import torch

from benchmarks.floor import count_flops
from benchmarks.records import emit, environment, over_budget, unknown_case
from benchmarks.stand_ins.random_sd import build_sd_models
from benchmarks.timing import time_calls
from lift3d.guidance.loading import DiffusionModels

# the eager baseline is diffusers as it loads: SDPA attention in UNet and VAE, NCHW, no cuDNN autotuning
BASE = {"prompt": "a DSLR photo of a hamburger", "prompt_cache_dir": "none", "channels_last": False, "cudnn_benchmark": False,
        "vae_attention": "sdpa"}
FAST = {"channels_last": True, "cudnn_benchmark": True, "vae_attention": "math"}
# name -> (guidance kind, options over BASE, rough cost in seconds used by the time budget); run in this order
CASES: dict[str, tuple[str, dict[str, Any], float]] = {
    "sds-eager": ("sds", {}, 15),  # plain eager diffusers: fp16, NCHW, PyTorch SDPA
    "sds-cudnn-benchmark": ("sds", {"cudnn_benchmark": True}, 10),
    "sds-vae-math-attention": ("sds", {"vae_attention": "math"}, 10),
    "sds-channels-last": ("sds", FAST, 10),
    "sds-compile-cudagraphs": ("sds", {**FAST, "compile": True, "cuda_graphs": True}, 120),
    "sds-compile": ("sds", {**FAST, "compile": True}, 90),
    "sds-channels-last-bf16": ("sds", {**FAST, "dtype": "bf16"}, 10),
    "sds-fused-qkv": ("sds", {**FAST, "fuse_qkv": True}, 10),
    "vsd-eager": ("vsd", {}, 20),
    "vsd-channels-last": ("vsd", FAST, 20),
    "vsd-compile-cudagraphs": ("vsd", {**FAST, "compile": True, "cuda_graphs": True}, 240),
    "sds-compile-cudagraphs-bf16": ("sds", {**FAST, "compile": True, "cuda_graphs": True, "dtype": "bf16"}, 150),
}


def make_guidance(kind: str, options: dict[str, Any], models: DiffusionModels, resolution: int, device: torch.device):
    from lift3d.guidance.sds import StableDiffusionGuidance
    from lift3d.guidance.vsd import VSDGuidance

    cls = VSDGuidance if kind == "vsd" else StableDiffusionGuidance
    return cls({**BASE, **options, "resolution": resolution}, models=models).to(device)


def batch_for(n: int, device: torch.device) -> dict[str, Any]:
    from lift3d.cameras import Cameras, intrinsics_from_fovy, spherical_to_c2w

    el, az = torch.full((n,), 15.0), torch.linspace(-60.0, 60.0, n)
    c2w = spherical_to_c2w(torch.deg2rad(el), torch.deg2rad(az), torch.full((n,), 2.0))
    cameras = Cameras(c2w, intrinsics_from_fovy(torch.full((n,), 0.8), 64, 64), 64, 64).to(device)
    # on the device, as Lightning hands batches to training_step
    return {"elevation_deg": el.to(device), "azimuth_deg": az.to(device), "distance": torch.full((n,), 2.0, device=device),
            "cameras": cameras, "step": 0}


def step(guidance, rgb: torch.Tensor, batch: dict[str, Any]) -> None:
    rgb.grad = None
    out = guidance(rgb, batch)
    next(v for k, v in out.items() if k.startswith("loss_")).backward()


def run_case(name: str, kind: str, options: dict[str, Any], models: DiffusionModels, args, device) -> dict[str, Any]:
    torch._dynamo.reset()
    guidance = make_guidance(kind, options, models, args.resolution, device)
    try:
        return time_steps(name, guidance, options, args, device)
    finally:
        if options.get("fuse_qkv"):
            models.unet.unfuse_qkv_projections()  # the SDS models are shared by the following cases


def time_steps(name: str, guidance, options: dict[str, Any], args, device) -> dict[str, Any]:
    rgb = torch.rand(args.batch, args.resolution, args.resolution, 3, device=device, requires_grad=True)
    batch = batch_for(args.batch, device)
    record = {"case": name, **time_calls(lambda: step(guidance, rgb, batch), device, args.steps, args.warmup),
              "options": options}
    if device.type == "cuda" and args.profile:
        from benchmarks.profiling import ProfiledSteps

        with ProfiledSteps() as window:
            for _ in range(args.profile):
                step(guidance, rgb, batch)
        record["profile"] = window.summary(args.profile)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks guidance", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names, in order")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per case")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    parser.add_argument("--batch", type=int, default=1, help="views per step")
    parser.add_argument("--budget-s", type=float, default=300.0, help="skip cases whose rough cost would exceed this total")
    parser.add_argument("--tiny", action="store_true", help="tiny models at 64x64: a CPU smoke test of the benchmark")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after timing, profile N more steps (CUDA; benchmarks.profiling)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.resolution = 64 if args.tiny else 512
    if args.tiny:
        torch.set_num_threads(1)  # tiny models are all overhead
    started = time.perf_counter()
    env = environment(device)
    shared = build_sd_models(args.tiny, device)

    def models_for(kind: str) -> DiffusionModels:
        """SDS cases share one model (their options are undone by the next case); VSD adds adapters: a fresh one."""
        return shared if kind == "sds" else build_sd_models(args.tiny, device)

    flops: dict[str, int | None] = {}

    def flops_of(kind: str) -> int | None:
        """FLOPs of one eager step (torch.utils.flop_counter), counted once per kind."""
        if kind not in flops:
            flops[kind] = None
            try:
                guidance = make_guidance(kind, {}, models_for(kind), args.resolution, device)
                rgb = torch.rand(args.batch, args.resolution, args.resolution, 3, device=device, requires_grad=True)
                batch = batch_for(args.batch, device)
                step(guidance, rgb, batch)  # warm: text embeddings, lazy set-up
                flops[kind] = count_flops(lambda: step(guidance, rgb, batch))
            except Exception as error:  # noqa: BLE001  (report and go on)
                emit({"bench": "guidance", "flops": kind, "error": repr(error)[:500]})
        return flops[kind]

    results: dict[str, dict[str, Any]] = {}
    for name in args.cases.split(","):
        if name not in CASES:
            emit(unknown_case("guidance", name, CASES))
            continue
        kind, options, cost = CASES[name]
        skipped = over_budget("guidance", name, cost, time.perf_counter() - started, args.budget_s)
        if skipped:
            emit(skipped)
            continue
        step_flops = flops_of(kind)
        try:
            record = run_case(name, kind, options, models_for(kind), args, device)
        except Exception as error:  # noqa: BLE001  (one failing option must not hide the others)
            traceback.print_exc(file=sys.stderr)
            emit({"bench": "guidance", "case": name, "error": repr(error)[:500], **env})
            continue
        if step_flops:
            record["gflop_per_step"] = round(step_flops / 1e9, 1)
            record["achieved_tflops"] = round(step_flops / 1e12 / (record["median_ms"] / 1000), 1)
        baseline = results.get(f"{kind}-eager")
        if baseline:
            record["speedup_vs_eager"] = round(baseline["median_ms"] / record["median_ms"], 2)
        results[name] = record
        emit({"bench": "guidance", **record, **env})

    sds = {k: v for k, v in results.items() if k.startswith("sds-")}
    if "sds-eager" in sds:
        best = min(sds, key=lambda k: sds[k]["median_ms"])
        speedup = sds["sds-eager"]["median_ms"] / sds[best]["median_ms"]
        emit({"bench": "guidance", "summary": True, "eager_ms": sds["sds-eager"]["median_ms"], "best_case": best,
              "best_ms": sds[best]["median_ms"], "speedup": round(speedup, 2), "target_2x_met": speedup >= 2.0,
              "total_s": round(time.perf_counter() - started, 1), **env})
    return 0


if __name__ == "__main__":
    sys.exit(main())
