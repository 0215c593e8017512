"""Time one SDS step and one VSD step of lift3d's Stable Diffusion guidance, eager vs speed options.

The UNet and VAE have Stable Diffusion 2.1-base's architecture (configs written out below, so nothing
is downloaded) with random weights: the same compute as the real model. An SDS step is VAE encode
forward + backward at 512x512 and one UNet call on the CFG batch of 2 at 64x64 latents; a VSD step
adds the LoRA estimate and one LoRA training step. Prints one JSON line per case, then a summary
line comparing the fastest SDS case with the eager baseline (target: at least 2x).

    python benchmarks/bench_guidance.py                 # on a CUDA GPU, ~5 minutes (compiles)
    python benchmarks/bench_guidance.py --cases sds-eager,sds-channels-last
    python benchmarks/bench_guidance.py --tiny          # smoke test of the script on CPU
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lift3d.guidance.loading import DiffusionModels  # noqa: E402
from lift3d.guidance.score import scaled_linear_alphas_cumprod  # noqa: E402

# stabilityai/stable-diffusion-2-1-base unet/config.json and vae/config.json (architecture fields)
SD21_UNET = {
    "sample_size": 64, "in_channels": 4, "out_channels": 4, "center_input_sample": False, "flip_sin_to_cos": True,
    "freq_shift": 0, "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "mid_block_type": "UNetMidBlock2DCrossAttn",
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "only_cross_attention": False, "block_out_channels": [320, 640, 1280, 1280], "layers_per_block": 2, "downsample_padding": 1,
    "mid_block_scale_factor": 1, "act_fn": "silu", "norm_num_groups": 32, "norm_eps": 1e-5, "cross_attention_dim": 1024,
    "attention_head_dim": [5, 10, 20, 20], "dual_cross_attention": False, "use_linear_projection": True,
    "upcast_attention": False, "num_class_embeds": None, "class_embed_type": None, "resnet_time_scale_shift": "default",
}
SD21_VAE = {
    "in_channels": 3, "out_channels": 3, "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "act_fn": "silu", "latent_channels": 4,
    "norm_num_groups": 32, "sample_size": 768, "scaling_factor": 0.18215,
}
TINY_UNET = {**SD21_UNET, "sample_size": 8, "block_out_channels": [8, 16, 16, 16], "norm_num_groups": 4,
             "cross_attention_dim": 32, "attention_head_dim": [2, 2, 2, 2], "layers_per_block": 1}
TINY_VAE = {**SD21_VAE, "block_out_channels": [4, 4, 8, 8], "norm_num_groups": 2, "layers_per_block": 1}
# MVDream's camera MLP over SD 2.1's UNet
MVDREAM_UNET = {"class_embed_type": "projection", "projection_class_embeddings_input_dim": 16}

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


def build_models(tiny: bool, device: torch.device, unet_extra: dict[str, Any] | None = None) -> DiffusionModels:
    """Random-weight SD-2.1-base-shaped (or tiny) UNet and VAE on ``device``, and a stand-in text encoder;
    ``unet_extra`` changes the UNet's config (``MVDREAM_UNET``: an MVDream-shaped UNet)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel

    unet_cfg, vae_cfg = (TINY_UNET, TINY_VAE) if tiny else (SD21_UNET, SD21_VAE)
    unet_cfg = {**unet_cfg, **(unet_extra or {})}
    torch.manual_seed(0)
    with torch.device(device):
        unet, vae = UNet2DConditionModel(**unet_cfg), AutoencoderKL(**vae_cfg)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    unet.to(dtype).requires_grad_(False).eval()
    vae.to(dtype).requires_grad_(False).eval()
    width = unet_cfg["cross_attention_dim"]

    def text_encoder(device: torch.device, dtype: torch.dtype):
        return lambda texts: torch.randn(len(texts), 77, width, generator=torch.Generator().manual_seed(len(texts)))

    return DiffusionModels(unet, vae, scaled_linear_alphas_cumprod().float(), "epsilon", text_encoder, "bench-random-sd21")


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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def step(guidance, rgb: torch.Tensor, batch: dict[str, Any]) -> None:
    rgb.grad = None
    out = guidance(rgb, batch)
    next(v for k, v in out.items() if k.startswith("loss_")).backward()


def count_flops(guidance, rgb: torch.Tensor, batch: dict[str, Any]) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step(guidance, rgb, batch)
    return int(counter.get_total_flops())


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
    started = time.perf_counter()
    for _ in range(args.warmup):
        step(guidance, rgb, batch)
    sync(device)
    warmup_s = time.perf_counter() - started
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        sync(device)
        t0 = time.perf_counter()
        step(guidance, rgb, batch)
        sync(device)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    record = {
        "case": name, "median_ms": round(statistics.median(times), 3), "p10_ms": round(times[len(times) // 10], 3),
        "p90_ms": round(times[(len(times) * 9) // 10], 3), "mean_ms": round(statistics.fmean(times), 3), "steps": len(times),
        "warmup_s": round(warmup_s, 1), "options": options,
    }
    if device.type == "cuda":
        record["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        if args.profile:
            from profiling import ProfiledSteps

            with ProfiledSteps() as window:
                for _ in range(args.profile):
                    step(guidance, rgb, batch)
            record["profile"] = window.summary(args.profile)
    return record


def environment(device: torch.device) -> dict[str, Any]:
    """What a benchmark record says about where it ran: package versions, the device, its GPU (every script's JSON)."""
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    info = {"torch": torch.__version__, "diffusers": version("diffusers"), "gsplat": version("gsplat"),
            "lift3d": version("lift3d"), "python": platform.python_version(), "device": str(device)}
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), gpus_visible=torch.cuda.device_count(), cuda=torch.version.cuda)
    return info


def emit(record: dict[str, Any]) -> None:
    """One JSON line to stdout, flushed (a caller reading the pipe sees each case as it ends)."""
    print(json.dumps(record), flush=True)


def unknown_case(bench: str, name: str, known: Iterable[str]) -> dict[str, Any]:
    """The error record of a case name the benchmark does not have."""
    return {"bench": bench, "case": name, "error": f"unknown case; known: {', '.join(known)}"}


def over_budget(bench: str, name: str, cost_s: float, elapsed_s: float, budget_s: float) -> dict[str, Any] | None:
    """The record of a case skipped because its rough cost would take the run past ``budget_s``; None when it fits."""
    if elapsed_s + cost_s <= budget_s:
        return None
    return {"bench": bench, "case": name, "skipped": f"time budget ({elapsed_s:.0f}s used, ~{cost_s:.0f}s needed)"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names, in order")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per case")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    parser.add_argument("--batch", type=int, default=1, help="views per step")
    parser.add_argument("--budget-s", type=float, default=300.0, help="skip cases whose rough cost would exceed this total")
    parser.add_argument("--tiny", action="store_true", help="tiny models at 64x64: a CPU smoke test of this script")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after timing, profile N more steps (CUDA; benchmarks/profiling.py)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.resolution = 64 if args.tiny else 512
    if args.tiny:
        torch.set_num_threads(1)  # tiny models are all overhead
    started = time.perf_counter()
    env = environment(device)
    shared = build_models(args.tiny, device)

    def models_for(kind: str) -> DiffusionModels:
        """SDS cases share one model (their options are undone by the next case); VSD adds adapters: a fresh one."""
        return shared if kind == "sds" else build_models(args.tiny, device)

    flops: dict[str, int | None] = {}

    def flops_of(kind: str) -> int | None:
        """FLOPs of one eager step (torch.utils.flop_counter), counted once per kind."""
        if kind not in flops:
            flops[kind] = None
            try:
                guidance = make_guidance(kind, {}, models_for(kind), args.resolution, device)
                rgb = torch.rand(args.batch, args.resolution, args.resolution, 3, device=device, requires_grad=True)
                step(guidance, rgb, batch_for(args.batch, device))  # warm: text embeddings, lazy set-up
                flops[kind] = count_flops(guidance, rgb, batch_for(args.batch, device))
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
