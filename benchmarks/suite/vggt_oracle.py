"""Learned poses downstream: held-out PSNR of 3D Gaussians trained from an oracle twin of VGGT (true cameras and depth
plus noise) with pose refinement and the dense start, beside the same photos with true poses and with structure
from motion.

The photos are the sample toy on its textured floor (``tests.sfm_scene``), rendered at known cameras. Three cases,
each on its own copy of the photos and trained by ``lift3d.reconstruct`` on the CPU recipe with the same budget:
``true`` (the oracle without noise; pose refinement off), ``learned`` (the oracle with noise on the training photos'
cameras and depth; the record beside the model turns pose refinement on), ``sfm`` (pycolmap, as
``lift3d poses --method sfm``). Held-out photos (every 8th) keep their true cameras in the oracle cases, so their
PSNR measures the scene. One JSON line per case, then a summary: ``learned`` minus ``true`` and minus ``sfm``, in dB.

    python -m benchmarks vggt_oracle                       # 20 photos at 128 px, 150 steps each (half an hour on 2 CPU cores)
    python -m benchmarks vggt_oracle --rotation-deg 1 --position 0.01
    python -m benchmarks vggt_oracle --tiny                # a smoke run: 10 photos at 64 px, 20 steps
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.records import emit
from benchmarks.stand_ins.oracle_poses import OraclePredictor
from tests.sfm_scene import pose_errors, write_photos

CASES = ("true", "learned", "sfm")


def training_overrides(steps: int, root: Path, max_gaussians: int) -> list[str]:
    """The CPU recipe's schedules compressed to ``steps`` (as reconstruct-gaussians-cpu compresses 30k into 1000)."""
    return [f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "trainer.run_test_after_fit=false",
            "trainer.enable_progress_bar=false", "system.export.formats=[]", f"output_root={root}", "use_timestamp=false",
            "system.appearance.enabled=false", "checkpoint.every_n_minutes=0",
            f"system.densify.refine_start={steps // 5}", f"system.densify.refine_stop={steps * 4 // 5}",
            f"system.densify.refine_every={max(10, steps // 10)}", f"system.densify.max_gaussians={max_gaussians}",
            f"system.pose_refinement.lr=[[0,0],[{steps // 5},3.0e-4],[{steps},3.0e-6]]",
            f"system.optimizer.params.gaussians\\.means.lr=[0,1.6e-4,1.6e-6,{steps},log]"]


def pose_accuracy(scene: Path, cameras, names: list[str]) -> dict[str, float]:
    """Worst rotation error (degrees) and position error (share of the extent) of the scene's model, after a
    similarity alignment onto the true cameras."""
    from lift3d.data.formats.colmap import read_colmap

    capture, _ = read_colmap(scene)
    order = [names.index(frame.name) for frame in capture.frames]
    rotation, position, extent = pose_errors(np.stack([f.c2w for f in capture.frames]), cameras.c2w.double().numpy()[order])
    return {"rotation_err_deg": round(rotation, 4), "position_err": round(position / extent, 5),
            "registered": len(capture.frames)}


def run_case(case: str, photos: Path, work: Path, cameras, names: list[str], args: argparse.Namespace) -> dict:
    """Pose one copy of the photos the case's way, train on it, and say how it went."""
    import lift3d
    from lift3d.data.learned_poses import LearnedPoseOptions, run_learned_poses
    from lift3d.data.sfm import SfmOptions, prepare_capture

    scene = work / f"{case}-poses"  # the folder names the run's tag: "true" alone would read as a boolean
    shutil.copytree(photos, scene / "images")
    record: dict = {"bench": "vggt_oracle", "case": case, "photos": len(names), "resolution": args.resolution,
                    "steps": args.steps, "tiny": args.tiny}
    start = time.perf_counter()
    held_out = set(names[::8])  # lift3d holds out every 8th photo in name order
    try:
        if case == "sfm":
            prepare_capture(scene, SfmOptions(num_threads=1))
        else:
            noisy = case == "learned"
            oracle = OraclePredictor(cameras, names, rotation_deg=args.rotation_deg if noisy else 0.0,
                                     position=args.position if noisy else 0.0, depth=args.depth if noisy else 0.0,
                                     exact=held_out, seed=args.seed)
            run_learned_poses(scene, oracle, LearnedPoseOptions(points=args.points))
            if noisy:
                record["noise"] = oracle.record()["noise"]
    except ValueError as error:  # SfM that registers too few photos says why in one line
        return {**record, "error": str(error)}
    record["pose_s"] = round(time.perf_counter() - start, 2)
    record.update(pose_accuracy(scene, cameras, names))
    overrides = training_overrides(args.steps, work / "runs" / case, args.max_gaussians)
    if case == "true":
        overrides.append("system.pose_refinement.enabled=false")
    start = time.perf_counter()
    run = lift3d.reconstruct(scene, "gaussians", overrides=overrides)
    record["train_s"] = round(time.perf_counter() - start, 2)
    val = run.metrics.get("val") or {}
    record.update(psnr=val.get("psnr"), ssim=val.get("ssim"), val_views=val.get("views"),
                  pose_refinement=str(run.config.system["pose_refinement"]["enabled"]))
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks vggt_oracle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--views", type=int, default=None, help="photos of the toy (default 20; --tiny: 10)")
    parser.add_argument("--resolution", type=int, default=None, help="photo side in pixels (default 128; --tiny: 64)")
    parser.add_argument("--steps", type=int, default=None, help="training steps of each case (default 150; --tiny: 20)")
    parser.add_argument("--rotation-deg", type=float, default=0.5, help="learned: camera rotation noise (default 0.5)")
    parser.add_argument("--position", type=float, default=0.005,
                        help="learned: camera position noise, share of the extent (default 0.005)")
    parser.add_argument("--depth", type=float, default=0.02, help="learned: relative depth noise (default 0.02)")
    parser.add_argument("--points", type=int, default=None, help="the dense start's points (default 4000; --tiny: 2000)")
    parser.add_argument("--max-gaussians", type=int, default=8000, help="the Gaussians' cap (default 8000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated of {', '.join(CASES)}")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: 10 photos at 64 px, 20 steps")
    parser.add_argument("--work", default=None, help="folder for the photos and runs (default: a temporary one)")
    args = parser.parse_args(argv)
    for key, full, tiny in (("views", 20, 10), ("resolution", 128, 64), ("steps", 150, 20), ("points", 4000, 2000)):
        if getattr(args, key) is None:
            setattr(args, key, tiny if args.tiny else full)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        emit({"bench": "vggt_oracle", "error": f"unknown cases {unknown}; known: {', '.join(CASES)}"})
        return 1
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="vggt_oracle_"))
    photos = work / "photos"
    cameras = write_photos(photos, n_views=args.views, resolution=args.resolution)
    names = sorted(p.name for p in photos.iterdir())
    results = {}
    for case in cases:
        results[case] = run_case(case, photos, work, cameras, names, args)
        emit(results[case])
    psnr = {case: r.get("psnr") for case, r in results.items()}
    summary: dict = {"bench": "vggt_oracle", "case": "summary", "psnr": psnr}
    if psnr.get("learned") is not None and psnr.get("true") is not None:
        summary["learned_minus_true_db"] = round(psnr["learned"] - psnr["true"], 3)
        summary["within_half_db_of_true"] = summary["learned_minus_true_db"] > -0.5
    if psnr.get("learned") is not None and "sfm" in results:
        sfm = psnr.get("sfm")
        summary["learned_minus_sfm_db"] = None if sfm is None else round(psnr["learned"] - sfm, 3)
        summary["beats_sfm"] = sfm is None or psnr["learned"] > sfm  # SfM that fails is beaten
    emit(summary)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0
