"""Meshes of real captures against the model they came from: a photo run's exported mesh rendered from the held-out
cameras, its silhouette compared with the model's own renders (mask IoU), and a picture of photo, render and mesh.

A capture has no true mesh; what can be measured is whether the mesh covers what the trained model shows from views it
was not fitted to. ``--run`` measures a finished run; without it the scene is reconstructed first (``lift3d
reconstruct SCENE --method M``, the CPU recipe on a machine without CUDA). The mesh is made as ``lift3d export`` makes
it (in the capture's frame: brought back to the training frame to be rendered). Prints one JSON line: the mean mask
IoU over the held-out views against the model's renders (alpha > 0.5) and, when the photos have alpha, against the
photos' masks; the mesh's faces; the meshing seconds. ``--picture`` writes a PNG of the first views: the photo, the
model's render, the mesh in its colors and the mesh shaded by its normals, one row per view.

    python -m benchmarks mesh_masks --method surfels --picture docs/images/sample-surfels-mesh.png
    python -m benchmarks mesh_masks --scene PATH/TO/fox --method surfels --picture fox-mesh.png
    python -m benchmarks mesh_masks --run outputs/reconstruct-surfels-cpu/fox
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.suite.surface_meshes import train

REPO = Path(__file__).resolve().parents[2]


def iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B] intersection over union of boolean masks [B, H, W] (1 where both are empty)."""
    union = (a | b).flatten(1).sum(1)
    return torch.where(union > 0, (a & b).flatten(1).sum(1) / union.clamp_min(1), torch.ones_like(union, dtype=torch.float))


def to_training_frame(mesh, world_from_capture: np.ndarray):
    """The exported mesh (capture frame) moved by the data module's similarity into the frame the model trained in."""
    m = np.asarray(world_from_capture, dtype=np.float64)
    vertices = mesh.vertices.astype(np.float64) @ m[:3, :3].T + m[:3, 3]
    return replace(mesh, vertices=vertices.astype(np.float32), normals=None)


def picture(rows: list[list[np.ndarray]], path: Path, min_side: int = 192) -> None:
    """Tile [H, W, 3] float images (one list per row) into a PNG, each enlarged (nearest pixel) to ``min_side``."""
    from PIL import Image

    grid = np.concatenate([np.concatenate(row, axis=1) for row in rows], axis=0)
    factor = max(1, -(-min_side // min(rows[0][0].shape[:2])))
    grid = grid.repeat(factor, axis=0).repeat(factor, axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((grid.clip(0, 1) * 255 + 0.5).astype(np.uint8)).save(path)


def main(argv: list[str] | None = None) -> None:
    from lift3d.data.sample_scene import sample_scene_path

    parser = argparse.ArgumentParser(prog="python -m benchmarks mesh_masks", description=__doc__.splitlines()[0])
    parser.add_argument("--scene", type=Path, default=None, help="the capture (default: the built-in sample scene)")
    parser.add_argument("--method", default="surfels", help="the lift3d reconstruct method")
    parser.add_argument("--run", type=Path, default=None, help="a finished run folder to measure (no training)")
    parser.add_argument("--work", type=Path, default=REPO / "outputs" / "mesh_masks", help="where runs are written")
    parser.add_argument("--export", nargs="*", default=[], help="system.export overrides for the meshing")
    parser.add_argument("--picture", type=Path, default=None, help="write a PNG of the first --rows held-out views")
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="config overrides for the training run (KEY=VALUE)")
    args = parser.parse_args(argv)

    from lift3d.config import load_config
    from lift3d.registry import find
    from lift3d.runs.run_dirs import load_system
    from lift3d.systems.base import BaseSystem

    scene = args.scene or sample_scene_path()
    run_dir, train_s = (args.run, None) if args.run else train(args.method, scene, args.work, args.overrides)
    cfg = load_config(str(run_dir / "configs" / "parsed.yaml"), overrides=args.export)
    system = load_system(cfg, run_dir / "ckpts" / "last.ckpt")
    system.eval()
    held_out = BaseSystem.build_part(cfg.data_type, cfg.data).val_scene()
    cameras = held_out.cameras
    start = time.perf_counter()
    with torch.no_grad():
        mesh = system.export_sources().mesh()
        mesh_s = time.perf_counter() - start
        frame = getattr(system, "world_from_capture", torch.eye(4, dtype=torch.float64))
        mesh = to_training_frame(mesh, frame.cpu().numpy())
        rasterizer = find("mesh-rasterizer")({"normal_type": "face"})
        drawn = rasterizer(mesh.to("cpu"), cameras, background=torch.ones(3))
        model = system.render_views({"cameras": cameras, "background": torch.ones(3)})
    mesh_mask, model_mask = drawn["alpha"][..., 0] > 0.5, model["alpha"][..., 0] > 0.5
    photo_alpha = held_out.rgba[..., 3]
    has_masks = bool((photo_alpha < 255).any())
    record = {"name": "mesh_masks", "scene": Path(scene).name, "method": args.method, "views": len(cameras),
              "size": [cameras.width, cameras.height], "iou_vs_model": round(float(iou(mesh_mask, model_mask).mean()), 4),
              "iou_vs_photo_masks": round(float(iou(mesh_mask, photo_alpha > 127).mean()), 4) if has_masks else None,
              "faces": len(mesh.faces), "mesh_s": round(mesh_s, 1), "train_s": None if train_s is None else round(train_s, 1),
              "device": "cuda" if torch.cuda.is_available() else "cpu", "host": platform.node(), "run": str(run_dir)}
    print(json.dumps(record), flush=True)
    if args.picture:
        rows = []
        for i in range(min(args.rows, len(cameras))):
            photo = held_out.rgba[i].float() / 255
            photo = photo[..., :3] * photo[..., 3:] + (1 - photo[..., 3:])  # on white, as the renders
            normals = drawn["normal"][i] * 0.5 + 0.5
            shaded = torch.where(mesh_mask[i, ..., None], normals, torch.ones_like(normals))
            rows.append([photo.numpy(), model["rgb"][i].clamp(0, 1).numpy(), drawn["rgb"][i].clamp(0, 1).numpy(),
                         shaded.numpy()])
        picture(rows, args.picture)


if __name__ == "__main__":
    main()
