"""The cases of ``python -m benchmarks step_floors``: each builds its inputs and returns one step to time.

A case's ``setup(ctx)`` returns a ``Prepared``: the step (a no-argument callable doing one full unit of
work, e.g. forward + backward), the precision of its matmuls, and fields describing it. Compiled cases
name the eager case doing the same work (``flops_from``): FLOPs are counted on eager code only. Guidance cases reuse
``suite.guidance`` (SD-2.1-base-shaped random weights); rasterizer cases reuse ``suite.rasterizer``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.stand_ins.random_sd import build_sd_models
from benchmarks.suite import guidance as bg


@dataclass
class Context:
    device: torch.device
    tiny: bool
    shared: dict[str, Any] = field(default_factory=dict)  # models reused across cases


@dataclass
class Prepared:
    step: Callable[[], None]  # one unit of work (what is timed)
    precision: str  # fp16, bf16, tf32 or fp32: which measured matmul rate the floor uses
    info: dict[str, Any] = field(default_factory=dict)  # fields added to the case's record


@dataclass
class Case:
    name: str
    group: str
    cost_s: float  # rough seconds on an H100 including warm-up (compilation): the time budget uses it
    setup: Callable[[Context], Prepared]
    warmup: int = 3
    steps: int = 20
    note: str = ""  # what the case stands for (printed by --list)
    flops_from: str = ""  # compiled cases: the eager case doing the same work, whose counted FLOPs apply


# ---------------------------------------------------------------------------------------------- guidance
GUIDANCE_FAST = bg.FAST  # channels-last, cuDNN autotuning, math attention in the VAE


def guidance_case(kind: str, options: dict[str, Any]) -> Callable[[Context], Prepared]:
    """SDS / VSD step at 512^2 (64^2 tiny): VAE encode fwd+bwd, CFG UNet call (VSD: + LoRA estimate and update)."""

    def setup(ctx: Context) -> Prepared:
        torch._dynamo.reset()
        torch.backends.cudnn.benchmark = False  # a global flag: each case sets it through its own options
        if kind == "sds":
            models = ctx.shared.get("sds-models") or ctx.shared.setdefault("sds-models", build_sd_models(ctx.tiny, ctx.device))
        else:
            ctx.shared.pop("sds-models", None)  # VSD adds adapters: fresh models, and the SDS ones are freed
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
            models = build_sd_models(ctx.tiny, ctx.device)
        resolution = 64 if ctx.tiny else 512
        guidance = bg.make_guidance(kind, options, models, resolution, ctx.device)
        dtype = options.get("dtype", "fp16")
        precision = {"fp32": "tf32"}.get(dtype, dtype) if ctx.device.type == "cuda" else "fp32"  # cuDNN convs use TF32
        return Prepared(bind(guidance, resolution, ctx.device), precision, {"resolution": resolution, "options": options})

    return setup


def bind(guidance: Any, resolution: int, device: torch.device) -> Callable[[], None]:
    rgb = torch.rand(1, resolution, resolution, 3, device=device, requires_grad=True)
    batch = bg.batch_for(1, device)
    return lambda: bg.step(guidance, rgb, batch)


# ---------------------------------------------------------------------------------------------- rasterizer
def raster_case(backend: str, backward: bool) -> Callable[[Context], Prepared]:
    """Gaussian splatting of 100k Gaussians (2k tiny) at 512^2 (64^2 tiny), SH degree 3."""

    def setup(ctx: Context) -> Prepared:
        from benchmarks.suite import rasterizer as br
        from lift3d.render.splats.renderer import rasterize

        if backend == "gsplat" and ctx.device.type != "cuda":
            raise SkipCase("gsplat needs CUDA")
        if backend == "gsplat":
            import importlib.util

            if importlib.util.find_spec("gsplat") is None:
                raise SkipCase("gsplat is not installed")
        n, resolution = (2000, 64) if ctx.tiny else (100_000, 512)
        splats, cams = br.scene(n, ctx.device), br.cameras(resolution, ctx.device)
        params = [t.requires_grad_() for t in (splats.means, splats.quats, splats.scales, splats.opacities, splats.sh)]
        options: dict[str, Any] = {"backend": backend, "sh_degree": 3}
        if ctx.device.type == "cuda":
            options["chunk_elements"] = 1 << 25  # as the rasterizer benchmark: larger chunks on a GPU

        def step() -> None:
            if not backward:
                with torch.no_grad():
                    rasterize(splats, cams, **options)
                return
            out = rasterize(splats, cams, **options)
            (out["rgb"].sum() + out["alpha"].sum()).backward()
            for p in params:
                p.grad = None

        return Prepared(step, "tf32", info={"gaussians": n, "resolution": resolution, "backend": backend})

    return setup


# ---------------------------------------------------------------------------------------------- NeRF
def nerf_case(resolution: int, backward: bool) -> Callable[[Context], Prepared]:
    """Render one view of the reconstruct-nerf field (hash grid, occupancy marching) with random weights
    and an occupancy grid holding a ball of radius 0.6 (an object-sized region, as after training)."""

    def setup(ctx: Context) -> Prepared:
        from lift3d.cameras import Cameras, intrinsics_from_fovy, spherical_to_c2w
        from lift3d.config import load_config
        from lift3d.recipes import recipe_config
        from lift3d.registry import find

        overrides = []
        if ctx.tiny:
            overrides = ["system.field.encoding.n_levels=4", "system.field.encoding.log2_hashmap_size=12",
                         "system.renderer.steps_per_diagonal=64", "system.renderer.occupancy.resolution=16"]
        cfg = load_config(recipe_config("reconstruct-nerf"), overrides=overrides)
        torch.manual_seed(0)
        system = find(cfg.system_type)(cfg.system).to(ctx.device)
        renderer = system.renderer
        grid = renderer.occupancy
        r = grid.resolution
        cells = torch.arange(r**3, device=ctx.device)
        centers = grid.cell_points(cells, jitter=False)
        grid.occupied.copy_(centers.norm(dim=-1) < 0.6)
        size = resolution if not ctx.tiny else resolution // 8
        c2w = spherical_to_c2w(torch.deg2rad(torch.tensor([15.0])), torch.tensor([0.3]), torch.tensor([2.5]))
        cams = Cameras(c2w, intrinsics_from_fovy(torch.tensor([0.7]), size, size), size, size).to(ctx.device)
        background = torch.ones(1, 3, device=ctx.device)
        renderer.train(backward)
        params = [p for p in system.parameters() if p.requires_grad]
        if ctx.device.type == "cuda":
            torch.set_float32_matmul_precision(system.cfg.matmul_precision)

        def step() -> None:
            if not backward:
                with torch.no_grad():
                    renderer(cams, background=background)
                return
            out = renderer(cams, background=background)
            out["rgb"].sum().backward()
            for p in params:
                p.grad = None

        return Prepared(step, "tf32", info={"resolution": size, "backward": backward})

    return setup


class SkipCase(Exception):
    """A case that cannot run here (missing backend or device); reported as skipped, not failed."""


def all_cases() -> list[Case]:
    """Every case, in priority order (the budget drops the tail first)."""
    fast = GUIDANCE_FAST
    cases = [
        Case("sds-eager", "guidance", 15, guidance_case("sds", {}), note="diffusers fp16, NCHW, SDPA: the baseline"),
        Case("sds-channels-last", "guidance", 10, guidance_case("sds", fast), flops_from="sds-eager",
             note="channels-last + cudnn.benchmark + math VAE attention"),
        Case("sds-compile-cudagraphs", "guidance", 120, guidance_case("sds", {**fast, "compile": True, "cuda_graphs": True}),
             warmup=4, flops_from="sds-eager",
             note="the fast path: torch.compile reduce-overhead (CUDA graphs) of UNet and VAE encoder"),
        Case("vsd-eager", "guidance", 25, guidance_case("vsd", {}),
             note="ProlificDreamer step: CFG + LoRA estimate + LoRA update"),
        Case("raster-torch-fwd", "rasterizer", 10, raster_case("torch", False)),
        Case("raster-torch-fwdbwd", "rasterizer", 15, raster_case("torch", True)),
        Case("raster-gsplat-fwd", "rasterizer", 15, raster_case("gsplat", False)),
        Case("raster-gsplat-fwdbwd", "rasterizer", 10, raster_case("gsplat", True)),
        Case("nerf-64-fwdbwd", "nerf", 10, nerf_case(64, True), note="DreamFusion-size training render"),
        Case("nerf-512-fwd", "nerf", 20, nerf_case(512, False), steps=5, note="a 512^2 evaluation render"),
        Case("vsd-channels-last", "guidance", 25, guidance_case("vsd", fast), flops_from="vsd-eager"),
        Case("sds-compile-cudagraphs-bf16", "guidance", 120,
             guidance_case("sds", {**fast, "compile": True, "cuda_graphs": True, "dtype": "bf16"}), warmup=4,
             flops_from="sds-eager"),
        Case("sds-compile-max-autotune", "guidance", 200,
             guidance_case("sds", {**fast, "compile": True, "compile_mode": "max-autotune-no-cudagraphs"}), warmup=4,
             flops_from="sds-eager"),
        Case("sds-eager-fp32", "guidance", 25, guidance_case("sds", {"dtype": "fp32"}), flops_from="sds-eager",
             note="context only: diffusers' default dtype (the summary compares with fp16 sds-eager)"),
        Case("vsd-compile-cudagraphs", "guidance", 200, guidance_case("vsd", {**fast, "compile": True, "cuda_graphs": True}),
             warmup=4, flops_from="vsd-eager"),
    ]
    return cases
