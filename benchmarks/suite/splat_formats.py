"""Sizes and render fidelity of lift3d's Gaussian file formats on a lego reconstruction.

Writes the same Gaussians as the 3DGS .ply, .splat, .spz, .sog, .ksplat and KHR_gaussian_splatting .glb, reads each
back through ``lift3d.gaussians.formats.files.load_gaussian_file`` (what ``lift3d`` uses wherever it loads a Gaussian
file), renders it with lift3d's rasterizer from an orbit of views around the object and prints one JSON line:
each file's size, its ratio to the .ply, and the PSNR of its renders against the .ply's renders (the .ply is
lossless, so its renders are the reference; ``null`` means identical images). Targets: .sog and .spz at least 8x
smaller than the .ply with render PSNR >= 30 dB.

By default it first fits Gaussians to NeRF-synthetic lego on the CPU (the reconstruct-gaussians-cpu recipe,
SH degree 3, 200 steps at 160 px: minutes on two CPU cores):

    python -m benchmarks splat_formats

or measures a .ply made elsewhere (e.g. a 30k-step GPU run's it30000-gaussians.ply):

    python -m benchmarks splat_formats --ply outputs/.../save/it30000-gaussians.ply

and, for a trained scene, scores the renders from its held-out cameras instead of an orbit (a capture's Gaussians are
a room around the cameras, not an object at the origin):

    python -m benchmarks splat_formats --ply RUN/save/it7000-gaussians.ply --cameras-from ../shared/data/fox --views 7
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.suite.lego_gaussians import default_data
from lift3d.config import load_config
from lift3d.export.video import orbit_cameras
from lift3d.gaussians.formats.files import load_gaussian_file
from lift3d.gaussians.formats.gltf import save_gltf_splat
from lift3d.gaussians.formats.ksplat import save_ksplat
from lift3d.gaussians.formats.ply import save_ply, with_sh_degree
from lift3d.gaussians.formats.sog import save_sog
from lift3d.gaussians.formats.splat import rgb_from_sh_dc, write_splat
from lift3d.gaussians.formats.spz import save_spz
from lift3d.gaussians.tensors import GaussianTensors
from lift3d.metrics import psnr
from lift3d.recipes import recipe_config
from lift3d.registry import find
from lift3d.sh import degree_of


def train_lego(data: Path, steps: int, max_side: int, output: Path) -> dict[str, torch.Tensor]:
    """Pre-activation parameters of Gaussians fitted to lego on the CPU (reconstruct-gaussians-cpu, SH degree 3)."""
    import lightning as L

    from lift3d.runs.run_dirs import make_run_dir
    from lift3d.runs.runner import build_parts, build_trainer

    overrides = [
        f"output_root={output}", f"data.root={data}", f"data.max_side={max_side}", f"trainer.max_steps={steps}",
        "trainer.accelerator=cpu", "trainer.val_check_interval=0", "trainer.run_test_after_fit=false",
        "trainer.enable_progress_bar=false", "checkpoint.every_n_train_steps=0", "checkpoint.save_last=false",
        "system.gaussians.sh_degree=3", f"system.gaussians.sh_degree_interval={max(1, steps // 4)}",
        f"system.densify.refine_stop={int(steps * 0.8)}", "system.export.formats=[]", "tag=formats-bench",
    ]
    cfg = load_config(recipe_config("reconstruct-gaussians-cpu"), overrides=overrides)
    run_dir = make_run_dir(cfg)
    trainer = build_trainer(cfg, run_dir, train=True)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule, system = build_parts(cfg)
    system.set_save_dir(run_dir / "save")
    trainer.fit(system, datamodule=datamodule)
    return {k: v.detach().cpu().float() for k, v in system.gaussians.parameters_dict().items()}


def write_all(params: dict[str, torch.Tensor], folder: Path) -> dict[str, tuple[Path, float]]:
    """Each format's file and the seconds its writer took."""
    n = len(params["means"])
    splat = GaussianTensors(params["means"], params["log_scales"].exp(), params["quats"], torch.sigmoid(params["opacity_logits"]),
                            colors=rgb_from_sh_dc(params["sh0"][:, 0]))
    writers = {
        "ply": lambda: save_ply(folder / "lego.ply", params),
        "splat": lambda: write_splat(folder / "lego.splat", splat)[0],
        "spz": lambda: save_spz(folder / "lego.spz", params),
        "sog": lambda: save_sog(folder / "lego.sog", params),
        "ksplat": lambda: save_ksplat(folder / "lego.ksplat", params),
        "gltf-splat": lambda: save_gltf_splat(folder / "lego-gaussians.glb", params),
    }
    out = {}
    for name, write in writers.items():
        start = time.perf_counter()
        path = write()
        out[name] = (path, time.perf_counter() - start)
        logging.getLogger("lift3d").info("wrote %s (%d Gaussians) in %.1f s", path.name, n, out[name][1])
    return out


def scene_cameras(root: Path, views: int, max_side: int):
    """``views`` of the scene's held-out cameras, evenly spaced, in the frame a run on it trains in (its normalization)."""
    from lift3d.data.posed_images import PosedImagesDataModule

    module = PosedImagesDataModule({"root": str(root), "max_side": max_side, "triangulate": False})
    cameras = module.val_scene().cameras
    pick = torch.linspace(0, len(cameras) - 1, min(views, len(cameras))).round().long()
    return cameras[pick]


def renderer_system(degree: int):
    """A reconstruct-gaussians system used only to render Gaussians at SH degree ``degree``."""
    fixed = [f"system.gaussians.sh_degree={degree}", "system.gaussians.sh_degree_interval=0", "system.gaussians.init=random",
             "system.renderer.backend=torch" if not torch.cuda.is_available() else "system.renderer.backend=auto"]
    cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=fixed)
    return find(cfg.system_type)(cfg.system)


@torch.no_grad()
def render(system, params: dict[str, torch.Tensor], cameras, degree: int, batch: int = 2) -> torch.Tensor:
    """Renders [V, H, W, 3] of the Gaussians (SH padded or cut to ``degree``) from ``cameras``."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    system.to(device)
    system.gaussians.set_parameters({k: v.to(device) for k, v in with_sh_degree(params, degree).items()})
    system.gaussians.active_sh_degree = degree
    background = torch.ones(3, device=device)
    images = [system.render_gaussians(cameras[i: i + batch].to(device), background)["rgb"].clamp(0, 1).cpu()
              for i in range(0, len(cameras), batch)]
    return torch.cat(images)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks splat_formats",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ply", type=Path, default=None, help="measure this 3DGS .ply instead of training on lego")
    parser.add_argument("--data", type=Path, default=default_data(), help="the lego scene folder (transforms_*.json)")
    parser.add_argument("--steps", type=int, default=200, help="CPU training steps when no --ply is given")
    parser.add_argument("--max-side", type=int, default=160, help="training image side when no --ply is given")
    parser.add_argument("--views", type=int, default=8, help="orbit views rendered per format")
    parser.add_argument("--size", type=int, default=256, help="rendered image side in pixels")
    parser.add_argument("--output", type=Path, default=None, help="folder for the files (default: a temporary one)")
    parser.add_argument("--cameras-from", type=Path, default=None, metavar="SCENE",
                        help="render from this scene's held-out cameras (a run's data.root) instead of an orbit")
    parser.add_argument("--camera-max-side", type=int, default=1600, help="with --cameras-from: data.max_side")
    args = parser.parse_args(argv)
    logging.getLogger("lift3d").setLevel(logging.INFO)
    logging.getLogger("lift3d").addHandler(logging.StreamHandler(sys.stderr))
    output = args.output or Path(tempfile.mkdtemp(prefix="lift3d-formats-"))
    output.mkdir(parents=True, exist_ok=True)

    start = time.perf_counter()
    params = load_gaussian_file(args.ply) if args.ply else train_lego(args.data, args.steps, args.max_side, output)
    train_seconds = time.perf_counter() - start
    degree = degree_of(params["shN"].shape[1] + 1)
    files = write_all(params, output)
    if args.cameras_from:
        cameras = scene_cameras(args.cameras_from, args.views, args.camera_max_side)
    else:
        cameras = orbit_cameras(args.views, 25.0, 4.0, 50.0, args.size, args.size)  # the recipe's turntable framing
    system = renderer_system(degree)
    reference = render(system, load_gaussian_file(files["ply"][0]), cameras, degree)
    ply_size = files["ply"][0].stat().st_size
    coverage = float((reference < 0.99).any(-1).float().mean())  # drawn pixels: the cameras see the Gaussians
    formats = {}
    for name, (path, seconds) in files.items():
        back = load_gaussian_file(path)
        images = reference if name == "ply" else render(system, back, cameras, degree)
        scores = psnr(images.flatten(1), reference.flatten(1))
        identical = bool(torch.equal(images, reference))
        formats[name] = {"file": path.name, "bytes": path.stat().st_size, "ply_ratio": round(ply_size / path.stat().st_size, 2),
                         "psnr_min": None if identical else round(float(scores.min()), 2),
                         "psnr_mean": None if identical else round(float(scores.mean()), 2),
                         "sh_degree": degree_of(back["shN"].shape[1] + 1), "write_seconds": round(seconds, 2)}
    targets = {name: formats[name]["ply_ratio"] >= 8 and (formats[name]["psnr_min"] or 99) >= 30 for name in ("spz", "sog")}
    print(json.dumps({"bench": "splat_formats", "gaussians": len(params["means"]), "sh_degree": degree,
                      "source": str(args.ply) if args.ply else f"lego CPU fit, {args.steps} steps at {args.max_side} px",
                      "fit_seconds": round(train_seconds, 1), "views": len(cameras),
                      "render_size": [cameras.width, cameras.height], "cameras": str(args.cameras_from or "orbit"),
                      "reference_coverage": round(coverage, 3),
                      "device": "cuda" if torch.cuda.is_available() else "cpu", "formats": formats,
                      "targets_met": targets}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
