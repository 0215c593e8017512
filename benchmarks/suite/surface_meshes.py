"""Surfaces from photos against the truth: a known mesh rendered into a Blender-layout capture, reconstructed by each
photo method, its mesh measured against the mesh it came from.

Each case renders ``--views`` training views (a Fibonacci sphere around the mesh, so every side is seen) and 8 held-out
views of ``--size`` pixels with lift3d's mesh rasterizer (spot with its texture, suzanne with a procedural albedo; a
baked light shades both), writes them as ``transforms_train/val.json`` + RGBA PNGs, runs ``lift3d reconstruct
--method M`` on them (the CPU recipes on a machine without CUDA) and meshes the run at ``--resolution`` voxels (3DGS:
density and marching cubes, NeRF: density and marching cubes, surfels: TSDF fusion of the median depth of the training
views). Prints one JSON line per (mesh, method): Chamfer distance (the mean of the two one-sided mean distances from
``--points`` area-uniform samples of each surface to the other surface), accuracy (ours to the truth) and completeness
(the truth the training views see to ours; ``--whole-truth``: all of it), all as % of the true mesh's bounding-box
diagonal; normal consistency (mean |cos| between each sample's normal and that of the nearest face of the other
surface, both ways); faces; training and meshing seconds.

    python -m benchmarks surface_meshes --views 40 --size 128                  # CPU, the CPU recipes
    python -m benchmarks surface_meshes --views 100 --size 400 --resolution 512  # GPU, the full recipes
    python -m benchmarks surface_meshes --methods surfels --meshes spot trainer.max_steps=300   # overrides pass on
    python -m benchmarks surface_meshes trainer.max_steps=7000 surfels:system.normal_start=3000  # METHOD: one method's
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lift3d.cameras import Cameras, intrinsics_matrix, look_at
from lift3d.meshes.mesh import face_normals

REPO = Path(__file__).resolve().parents[2]

MESHES = ("spot", "suzanne")
METHODS = ("gaussians", "nerf", "surfels")
FOVY_DEG = 40.0
DISTANCE = 2.2  # camera distance from the mesh's center (the mesh fits the unit box)
OBSERVED_TOLERANCE = 0.005  # a true point within this share of the diagonal behind the rendered surface is seen
LIGHT = torch.nn.functional.normalize(torch.tensor([0.4, -0.5, 0.75]), dim=0)  # towards the baked light


def default_data() -> Path:
    for root in (REPO.parent / "shared", REPO / "shared", Path("/work/shared")):
        if (root / "data" / "meshes" / "spot" / "spot.obj").is_file():
            return root / "data" / "meshes"
    return REPO.parent / "shared" / "data" / "meshes"


def load_truth(name: str, data: Path):
    """The true mesh in lift3d's frame (+z up, in the unit box), as lift3d reads it."""
    from lift3d.meshes.io import load_mesh

    if name == "spot":
        return load_mesh(data / "spot" / "spot.obj", texture_path=data / "spot" / "spot_texture.png")
    return load_mesh(data / name / f"{name}.obj")


def sphere_views(n: int, size: int, offset: float = 0.5) -> Cameras:
    """``n`` views of ``size`` pixels looking at the origin from a Fibonacci sphere (every side seen)."""
    i = torch.arange(n, dtype=torch.float64) + offset
    z = 1 - 2 * i / n
    azimuth = math.pi * (1 + 5**0.5) * i
    r = torch.sqrt((1 - z * z).clamp_min(0))
    eye = (DISTANCE * torch.stack([r * torch.cos(azimuth), r * torch.sin(azimuth), z], -1)).float()
    up = torch.where(z.abs()[:, None] > 0.99, torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.0, 0.0, 1.0])).float()
    c2w = look_at(eye, torch.zeros_like(eye), up)
    focal = torch.full((n,), 0.5 * size / math.tan(math.radians(FOVY_DEG) / 2))
    return Cameras(c2w, intrinsics_matrix(focal, focal, torch.full((n,), size / 2), torch.full((n,), size / 2)), size, size)


def shaded_albedo(mesh, name: str):
    """The color function of the renders: the mesh's albedo (spot's texture; a procedural pattern on suzanne) lit by
    one baked light, the same from every view."""
    from lift3d.render.meshes.renderer import sample_texture

    def color(surface: dict[str, torch.Tensor]) -> torch.Tensor:
        if name == "spot":
            albedo = sample_texture(mesh.texture[..., :3], surface["uv"])
        else:
            p = surface["points"] * 9.0
            pattern = 0.5 + 0.5 * torch.sin(p[:, 0]) * torch.sin(p[:, 1]) * torch.sin(p[:, 2])
            albedo = torch.stack([0.35 + 0.55 * pattern, 0.3 + 0.3 * (surface["points"][:, 2] + 0.5), 0.8 - 0.5 * pattern], -1)
        light = 0.35 + 0.65 * (surface["normals"] * LIGHT).sum(-1, keepdim=True).clamp_min(0)
        return (albedo * light).clamp(0, 1)

    return color


def write_capture(name: str, data: Path, folder: Path, views: int, size: int) -> Path:
    """Render the mesh into ``folder`` in the Blender layout (transforms_train/val.json, straight-alpha RGBA PNGs); a
    folder that holds a finished capture of as many views is kept (the renders are deterministic)."""
    from PIL import Image

    from lift3d.registry import find

    if _finished_capture(folder, views):
        return folder
    mesh = load_truth(name, data)
    renderer = find("mesh-rasterizer")({"normal_type": "vertex" if name == "spot" else "face"})
    color = shaded_albedo(mesh, name)
    for split, cameras in (("train", sphere_views(views, size)), ("val", sphere_views(8, size, offset=0.23))):
        (folder / split).mkdir(parents=True, exist_ok=True)
        frames = []
        for i in range(len(cameras)):
            with torch.no_grad():
                out = renderer(mesh, cameras[i], background=torch.zeros(3), color_fn=color)
            alpha = out["alpha"][0].clamp(0, 1)
            rgb = torch.where(alpha > 1e-6, out["rgb"][0] / alpha.clamp_min(1e-6), torch.zeros_like(out["rgb"][0]))
            rgba = (torch.cat([rgb.clamp(0, 1), alpha], -1) * 255 + 0.5).to(torch.uint8).numpy()
            Image.fromarray(rgba, "RGBA").save(folder / split / f"r_{i}.png")
            frames.append({"file_path": f"./{split}/r_{i}", "transform_matrix": cameras.c2w[i].double().tolist()})
        meta = {"camera_angle_x": math.radians(FOVY_DEG), "frames": frames}
        (folder / f"transforms_{split}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return folder


def _finished_capture(folder: Path, views: int) -> bool:
    """Whether ``folder`` holds both splits' transforms (written last) with ``views`` training frames."""
    try:
        train = json.loads((folder / "transforms_train.json").read_text())["frames"]
        json.loads((folder / "transforms_val.json").read_text())
    except (OSError, ValueError, KeyError):
        return False
    return len(train) == views


def train(method: str, scene: Path, output_root: Path, overrides: list[str]) -> tuple[Path, float]:
    """``lift3d reconstruct`` of ``scene`` with ``method`` in a fresh process: (its run folder, wall seconds)."""
    command = [sys.executable, "-m", "lift3d", "reconstruct", str(scene), "--method", method, f"output_root={output_root}",
               "use_timestamp=false", "trainer.enable_progress_bar=false", "trainer.run_test_after_fit=false",
               "system.export.formats=[]", "data.n_orbit_views=4", *overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return finished_run(output_root, scene), seconds


def finished_run(output_root: Path, scene: Path) -> Path | None:
    """The newest run of ``scene`` under ``output_root`` with a last checkpoint, if any."""
    runs = [p for p in output_root.glob(f"*/{scene.name}*") if (p / "ckpts" / "last.ckpt").is_file()]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def mesh_of_run(run_dir: Path, resolution: int, export_overrides: list[str]):
    """The run's mesh in lift3d's frame, as ``lift3d export --format glb`` makes it (vertex colors only)."""
    from lift3d.config import load_config
    from lift3d.runs.run_dirs import export_device, load_system

    overrides = [f"system.export.resolution={resolution}", "system.export.texture_size=0", *export_overrides]
    cfg = load_config(str(run_dir / "configs" / "parsed.yaml"), overrides=overrides)
    system = load_system(cfg, run_dir / "ckpts" / "last.ckpt", export_device())  # as `lift3d export` meshes it
    system.eval()
    with torch.no_grad():
        return system.export_sources().mesh()


def surface_samples(vertices: np.ndarray, faces: np.ndarray, n: int, seed: int = 0, with_faces: bool = False):
    """(points [n, 3], unit face normals [n, 3]) drawn uniformly by area from a triangle mesh (and their faces [n])."""
    rng = np.random.default_rng(seed)
    tri = vertices[faces].astype(np.float64)
    cross = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    area = np.linalg.norm(cross, axis=1)
    pick = rng.choice(len(faces), size=n, p=area / area.sum())
    u, v = rng.random(n), rng.random(n)
    flip = u + v > 1
    u, v = np.where(flip, 1 - u, u), np.where(flip, 1 - v, v)
    t = tri[pick]
    points = t[:, 0] + u[:, None] * (t[:, 1] - t[:, 0]) + v[:, None] * (t[:, 2] - t[:, 0])
    normals = cross[pick] / np.maximum(area[pick, None], 1e-20)
    return (points, normals, pick) if with_faces else (points, normals)


def closest_points_on_triangles(p: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """[M, 3] closest point to each ``p`` on the triangle (``a``, ``b``, ``c``), all [M, 3] (Ericson's regions: a
    vertex, an edge or the inside; a degenerate triangle gives one of its vertices or edges)."""
    ab, ac, ap, bp, cp = b - a, c - a, p - a, p - b, p - c
    dot = lambda x, y: (x * y).sum(-1)  # noqa: E731
    d1, d2, d3, d4, d5, d6 = dot(ab, ap), dot(ac, ap), dot(ab, bp), dot(ac, bp), dot(ab, cp), dot(ac, cp)
    va, vb, vc = d3 * d6 - d5 * d4, d5 * d2 - d1 * d6, d1 * d4 - d3 * d2
    safe = lambda x: np.where(x == 0, 1.0, x)  # noqa: E731  (a zero denominator's region is never the one taken)
    total = safe(va + vb + vc)
    point = a + ab * (vb / total)[:, None] + ac * (vc / total)[:, None]  # inside
    regions = [  # later ones win: the vertex regions are checked first in Ericson's order, so they come last here
        ((va <= 0) & (d4 - d3 >= 0) & (d5 - d6 >= 0), lambda: b + (c - b) * ((d4 - d3) / safe((d4 - d3) + (d5 - d6)))[:, None]),
        ((vb <= 0) & (d2 >= 0) & (d6 <= 0), lambda: a + ac * (d2 / safe(d2 - d6))[:, None]),
        ((d6 >= 0) & (d5 <= d6), lambda: c),
        ((vc <= 0) & (d1 >= 0) & (d3 <= 0), lambda: a + ab * (d1 / safe(d1 - d3))[:, None]),
        ((d3 >= 0) & (d4 <= d3), lambda: b),
        ((d1 <= 0) & (d2 <= 0), lambda: a),
    ]
    for where, at in regions:
        point = np.where(where[:, None], at(), point)
    return point


class SurfaceIndex:
    """A triangle mesh made ready for point-to-surface queries: its triangles and unit face normals, and KD-trees over a
    dense area-uniform sampling (each sample's face kept) and over the face centers. Built once per mesh: the truth's
    serves every method measured against it."""

    def __init__(self, vertices: np.ndarray, faces: np.ndarray):
        from scipy.spatial import cKDTree

        self.triangles = vertices[faces].astype(np.float64)
        self.normals = face_normals(torch.as_tensor(vertices, dtype=torch.float64),
                                    torch.as_tensor(faces, dtype=torch.long)).numpy()
        dense, _, self.dense_faces = surface_samples(vertices, faces, max(8 * len(faces), 1_000_000), seed=3,
                                                     with_faces=True)
        self.by_sample, self.by_center = cKDTree(dense), cKDTree(self.triangles.mean(1))

    def distances(self, points: np.ndarray, candidates: int = 8, chunk: int = 65536) -> tuple[np.ndarray, np.ndarray]:
        """(distance [n], unit normal of the nearest face [n]) from each point to the surface: the exact point-triangle
        distance to the faces of the ``candidates`` nearest dense samples and the ``candidates`` nearest face centers
        (the nearest face is among them unless it is far smaller than its neighbours; then the distance is still
        within the sampling's spacing of the true one)."""
        tri, faces = self.triangles, len(self.triangles)
        distance, nearest = np.empty(len(points)), np.empty(len(points), dtype=np.int64)
        for start in range(0, len(points), chunk):
            p = points[start:start + chunk]
            faces_near = np.concatenate([self.dense_faces[self.by_sample.query(p, candidates)[1]],
                                         self.by_center.query(p, min(candidates, faces))[1].reshape(len(p), -1)], axis=1)
            q = np.repeat(p, faces_near.shape[1], axis=0)
            t = tri[faces_near.ravel()]
            d = np.linalg.norm(closest_points_on_triangles(q, t[:, 0], t[:, 1], t[:, 2]) - q, axis=1).reshape(len(p), -1)
            best = d.argmin(1)
            distance[start:start + chunk] = d[np.arange(len(p)), best]
            nearest[start:start + chunk] = faces_near[np.arange(len(p)), best]
        return distance, self.normals[nearest]


def observed(points: np.ndarray, vertices: np.ndarray, faces: np.ndarray, cameras: Cameras, tolerance: float,
             min_size: int = 512) -> np.ndarray:
    """[n] whether each point on the mesh's surface is seen by at least one of ``cameras``: it projects into the image
    and lies no deeper than the mesh's own depth (rendered at ``min_size`` pixels or more, the deepest of the 4 pixels
    around it) plus ``tolerance``. What no photo shows (suzanne's eyes behind her face) no photo method can recover;
    DTU's observation masks leave it out of completeness the same way."""
    from lift3d.gaussians.init import project_points
    from lift3d.meshes.mesh import Mesh
    from lift3d.registry import find

    scale = max(1.0, min_size / max(cameras.width, cameras.height))
    cameras = cameras.resized(round(cameras.width * scale), round(cameras.height * scale))
    renderer = find("mesh-rasterizer")({"antialias": False})
    mesh = Mesh(torch.as_tensor(vertices, dtype=torch.float32), torch.as_tensor(faces, dtype=torch.long))
    points = torch.as_tensor(points, dtype=torch.float64)
    seen = torch.zeros(len(points), dtype=torch.bool)
    for i in range(len(cameras)):
        camera = cameras[i]
        with torch.no_grad():
            out = renderer(mesh, camera, background=torch.zeros(3))
        depth = torch.where(out["mask"][0, ..., 0], out["depth"][0, ..., 0].double(), torch.tensor(math.inf, dtype=torch.float64))
        uv, z = project_points(points, camera.to(torch.float64))  # pixel i spans [i, i + 1)
        u, v, z = uv[0, :, 0], uv[0, :, 1], z[0]
        left, top = torch.floor(u - 0.5).long(), torch.floor(v - 0.5).long()  # the 4 pixel centers around the point
        inside = (z > 0) & (left >= 0) & (top >= 0) & (left + 1 < camera.width) & (top + 1 < camera.height)
        left, top = left.clamp(0, camera.width - 2), top.clamp(0, camera.height - 2)
        deepest = torch.stack([depth[top + dy, left + dx] for dy in (0, 1) for dx in (0, 1)]).amax(0)
        seen |= inside & (z <= deepest + tolerance)
    return seen.numpy()


@dataclass
class Truth:
    """The true mesh as the measures use it: its query index, area-uniform samples with their face normals, which of
    them the training views see (None: no cameras given, all count) and the bounding-box diagonal the distances are
    given in."""

    index: SurfaceIndex
    samples: np.ndarray
    normals: np.ndarray
    seen: np.ndarray | None
    diagonal: float

    @classmethod
    def of(cls, vertices: np.ndarray, faces: np.ndarray, n: int, cameras: Cameras | None = None) -> Truth:
        diagonal = float(np.linalg.norm(vertices.max(0) - vertices.min(0)))
        samples, normals = surface_samples(vertices, faces, n, seed=2)
        seen = None if cameras is None else observed(samples, vertices, faces, cameras, OBSERVED_TOLERANCE * diagonal)
        return cls(SurfaceIndex(vertices, faces), samples, normals, seen, diagonal)


def compare(vertices: np.ndarray, faces: np.ndarray, truth: Truth) -> dict[str, float]:
    """Chamfer distance, accuracy, completeness (% of the true bounding-box diagonal) and normal consistency: as many
    area-uniform samples of our surface as the truth has, each surface's samples measured to the other surface itself
    (so a mesh against itself scores 0, where sample-to-sample distances would leave a floor of half the samples'
    spacing). Completeness and the truth's half of normal consistency count the true surface the training views see
    (``observed_pct`` of its area, given cameras; ``completeness_all_pct`` is over all of it)."""
    ours, our_normals = surface_samples(vertices, faces, len(truth.samples), seed=1)
    to_true, true_normals_near = truth.index.distances(ours)
    to_ours, our_normals_near = SurfaceIndex(vertices, faces).distances(truth.samples)
    seen = np.ones(len(truth.samples), dtype=bool) if truth.seen is None else truth.seen
    consistency = 0.5 * (np.abs((our_normals * true_normals_near).sum(-1)).mean()
                         + np.abs((truth.normals * our_normals_near).sum(-1))[seen].mean())
    accuracy, completeness = 100 * to_true.mean() / truth.diagonal, 100 * to_ours[seen].mean() / truth.diagonal
    record = {"chamfer_pct": round(0.5 * (accuracy + completeness), 4), "accuracy_pct": round(accuracy, 4),
              "completeness_pct": round(completeness, 4), "normal_consistency": round(float(consistency), 4)}
    if truth.seen is not None:
        record.update(observed_pct=round(100 * float(seen.mean()), 2),
                      completeness_all_pct=round(100 * to_ours.mean() / truth.diagonal, 4))
    return record


def method_overrides(overrides: list[str], method: str) -> list[str]:
    """The overrides for ``method``'s run: the plain ones, and those written ``METHOD:KEY=VALUE`` for it (prefix dropped)."""
    chosen = []
    for override in overrides:
        head, colon, rest = override.partition(":")
        if colon and "=" not in head:
            if head not in METHODS:
                raise SystemExit(f"surface_meshes: {override!r} names no method; the methods are {', '.join(METHODS)}")
            if head == method:
                chosen.append(rest)
        else:
            chosen.append(override)
    return chosen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks surface_meshes", description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", nargs="+", default=list(MESHES), choices=MESHES)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--views", type=int, default=40, help="training views (8 more are held out)")
    parser.add_argument("--size", type=int, default=128, help="image side in pixels")
    parser.add_argument("--resolution", type=int, default=256, help="meshing grid: voxels along the box's longest side")
    parser.add_argument("--points", type=int, default=200000, help="surface samples per mesh for the distances")
    parser.add_argument("--data", type=Path, default=default_data(), help="the folder holding spot/ and suzanne/")
    parser.add_argument("--work", type=Path, default=REPO / "outputs" / "surface_meshes", help="captures and runs")
    parser.add_argument("--export", nargs="*", default=[], help="system.export overrides for the meshing")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the newest finished run in --work of each mesh and method instead of training")
    parser.add_argument("--whole-truth", action="store_true",
                        help="completeness over all of the true surface, also what no training view sees")
    parser.add_argument("--save-glb", action="store_true", help="also write each mesh as <work>/<mesh>-<method>.glb")
    parser.add_argument("overrides", nargs="*",
                        help="config overrides for every training run (KEY=VALUE), or for one method's (METHOD:KEY=VALUE)")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in args.meshes:
        true_mesh = load_truth(name, args.data)
        scene = write_capture(name, args.data, args.work / f"{name}-{args.views}x{args.size}" / name, args.views, args.size)
        print(f"surface_meshes: {name}: capture written to {scene}", file=sys.stderr, flush=True)
        truth = Truth.of(true_mesh.vertices.double().numpy(), true_mesh.faces.numpy(), args.points,
                         None if args.whole_truth else sphere_views(args.views, args.size))
        for method in args.methods:
            overrides = method_overrides(args.overrides, method)
            runs = args.work / f"runs-{args.views}x{args.size}-{method}"
            run_dir, train_s = (finished_run(runs, scene), None) if args.reuse else (None, None)
            if run_dir is None:
                run_dir, train_s = train(method, scene, runs, overrides)
            how = "reused" if train_s is None else f"trained in {train_s:.0f} s"
            print(f"surface_meshes: {name}, {method}: {how} ({run_dir}); meshing", file=sys.stderr, flush=True)
            start = time.perf_counter()
            mesh = mesh_of_run(run_dir, args.resolution, args.export)
            mesh_s = time.perf_counter() - start
            if args.save_glb:
                from lift3d.export.writers import write_glb

                write_glb(mesh, args.work / f"{name}-{method}.glb")
            record = {"name": "surface_meshes", "mesh": name, "method": method, "views": args.views, "size": args.size,
                      "resolution": args.resolution, "device": device, "faces": len(mesh.faces),
                      **compare(mesh.vertices, mesh.faces, truth),
                      "train_s": None if train_s is None else round(train_s, 1), "mesh_s": round(mesh_s, 1),
                      "host": platform.node(), "overrides": overrides}
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
