"""The reference of ``python -m benchmarks lego_gaussians --reference plain``: 3DGS as a plain loop over gsplat.

gsplat's ``rasterization`` + ``DefaultStrategy`` + one Adam per parameter (gsplat's simple_trainer layout, the
3DGS learning rates, the position rate decaying to 1% over 30k steps as the recipe's, SH degree raised every 1000 steps), the loss
0.8 L1 + 0.2 D-SSIM (lift3d's SSIM, so both sides pay for the same metric), no Lightning. It starts from the
same Gaussians and photos as the recipe (the data module and the model's initialization are reused for that,
nothing of the training), so the two runs differ only in the training loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from benchmarks.timing import sync
from lift3d.cameras import Cameras
from lift3d.metrics import psnr, ssim

LEARNING_RATES = {"means": 1.6e-4, "scales": 5e-3, "quats": 1e-3, "opacities": 5e-2, "sh0": 2.5e-3, "shN": 2.5e-3 / 20}


def start_parameters(model: Any, device: torch.device) -> torch.nn.ParameterDict:
    """gsplat's parameter layout from an initialized lift3d GaussianModel (log scales, opacity logits, SH split)."""
    values = {"means": model.means, "scales": model.log_scales, "quats": model.quats, "opacities": model.opacity_logits,
              "sh0": model.sh0, "shN": model.shN}
    return torch.nn.ParameterDict({k: torch.nn.Parameter(v.detach().clone().to(device)) for k, v in values.items()})


def render(params: torch.nn.ParameterDict, cameras: Cameras, background: Tensor, sh_degree: int) -> tuple[Tensor, dict]:
    """[C, H, W, 3] renders of ``cameras`` (on the parameters' device) and gsplat's meta dict."""
    from gsplat import rasterization

    colors = torch.cat([params["sh0"], params["shN"]], 1)
    image, _, info = rasterization(
        params["means"], params["quats"], torch.exp(params["scales"]), torch.sigmoid(params["opacities"]), colors,
        cameras.w2c_opencv(), cameras.intrinsics, cameras.width, cameras.height, sh_degree=sh_degree,
        backgrounds=background.expand(len(cameras), 3), packed=False)
    return image, info


def train_plain(model: Any, datamodule: Any, steps: int, eval_at: set[int],
                evaluate: Callable[[Callable[[Cameras, Tensor], Tensor], int], dict], device: torch.device,
                decay_steps: int = 30000, host_profile: tuple[int, int] | None = None) -> dict[str, Any]:
    """Train ``steps`` steps; at each step in ``eval_at`` stop the clock and record ``evaluate(render_fn, step)``.
    ``host_profile`` (start, n): cProfile n steps from step start (profiling.HostProfile) into ``host_profile``."""
    from gsplat import DefaultStrategy

    from benchmarks.profiling import HostProfile

    extent = float(datamodule.extent)
    params = start_parameters(model, device)
    optimizers = {name: torch.optim.Adam([{"params": params[name], "lr": lr * (extent if name == "means" else 1.0),
                                           "name": name}], eps=1e-15) for name, lr in LEARNING_RATES.items()}
    decay = torch.optim.lr_scheduler.ExponentialLR(optimizers["means"], gamma=0.01 ** (1.0 / decay_steps))
    strategy = DefaultStrategy(verbose=False)
    strategy.check_sanity(params, optimizers)
    state = strategy.initialize_state(scene_scale=extent)

    scene = datamodule.train
    background = datamodule.background.to(device)
    rgba = scene.rgba.to(device).float() / 255.0
    photos = rgba[..., :3] * rgba[..., 3:] + background * (1 - rgba[..., 3:])
    cameras = scene.cameras.to(device)
    generator = torch.Generator().manual_seed(0)
    results: list[dict] = []
    profiled: dict[str, Any] = {}
    host = HostProfile() if host_profile else None
    train_s = 0.0
    sync(device)
    started = time.perf_counter()
    for step in range(steps):
        if host is not None and step == host_profile[0]:
            host.__enter__()
        if host is not None and step == host_profile[0] + host_profile[1]:
            host.__exit__(None, None, None)
            profiled = host.summary(host_profile[1])
        index = int(torch.randint(len(scene), (1,), generator=generator))
        sh_degree = min(step // 1000, 3)
        image, info = render(params, cameras[index], background, sh_degree)
        target = photos[index : index + 1]
        loss = 0.8 * (image - target).abs().mean() + 0.2 * (1.0 - ssim(image, target).mean())
        strategy.step_pre_backward(params, optimizers, state, step, info)
        loss.backward()
        for optimizer in optimizers.values():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        decay.step()
        strategy.step_post_backward(params, optimizers, state, step, info, packed=False)
        if step + 1 in eval_at:
            sync(device)
            train_s += time.perf_counter() - started
            with torch.no_grad():
                record = evaluate(lambda c, bg, degree=sh_degree: render(params, c, bg, degree)[0], step + 1)
            record.update(train_seconds=round(train_s, 1), gaussians=len(params["means"]),
                          steps_per_s=round((step + 1) / train_s, 2))
            results.append(record)
            sync(device)
            started = time.perf_counter()
    return {"results": results, "train_seconds": round(train_s, 1), **({"host_profile": profiled} if profiled else {})}


@torch.no_grad()
def score_views(render_fn: Callable[[Cameras, Tensor], Tensor], scene: Any, background: Tensor, device: torch.device) -> dict:
    """Mean PSNR / SSIM of ``render_fn`` over the views of ``scene`` against the photos on ``background``."""
    scores = []
    for i in range(len(scene)):
        rgba = scene.rgba[i : i + 1].to(device).float() / 255.0
        target = rgba[..., :3] * rgba[..., 3:] + background * (1 - rgba[..., 3:])
        prediction = render_fn(scene.cameras[i].to(device), background[None]).clamp(0, 1)
        scores.append(torch.stack([psnr(prediction, target), ssim(prediction, target)], -1))
    mean = torch.cat(scores).mean(0)
    return {"val_psnr": round(float(mean[0]), 3), "val_ssim": round(float(mean[1]), 4), "val_views": len(scene)}

