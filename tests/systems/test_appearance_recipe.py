"""Per-photo appearance end to end: the sample scene's photos as a camera with auto-exposure would take them (a
random exposure gain and color tint per training photo, held-out photos untouched), reconstructed by the
reconstruct-gaussians-sample recipe with appearance on and off, against the same photos unaltered."""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lift3d.config import load_config
from lift3d.data.sample_scene import sample_scene_path
from lift3d.recipes import recipe_config
from lift3d.runs.runner import run_experiment

GAIN = (0.5, 1.5)  # exposure gain per training photo
TINT = (0.7, 1.3)  # white-balance gain per color channel per training photo


def write_photos(out: Path, seed: int | None) -> Path:
    """A copy of the sample scene as opaque RGB photos on its white background (a camera sees a background too);
    with ``seed``, each training photo exposed with a random gain and tint and clipped to 0..255 as a camera does."""
    source = sample_scene_path()
    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        meta = json.loads((source / f"transforms_{split}.json").read_text())
        (out / split).mkdir(parents=True, exist_ok=True)
        for frame in meta["frames"]:
            rgba = np.asarray(Image.open(source / f"{frame['file_path']}.png").convert("RGBA")) / 255.0
            rgb = rgba[..., :3] * rgba[..., 3:] + (1.0 - rgba[..., 3:])
            if split == "train" and seed is not None:
                rgb = rgb * rng.uniform(*GAIN) * rng.uniform(*TINT, size=3)
            Image.fromarray((rgb.clip(0, 1) * 255 + 0.5).astype(np.uint8), "RGB").save(out / f"{frame['file_path']}.png")
        (out / f"transforms_{split}.json").write_text(json.dumps(meta))
    return out


def _val_psnr(tmp_path: Path, scene: Path, tag: str, appearance: str) -> float:
    config = recipe_config("reconstruct-gaussians-sample")
    overrides = [f"output_root={tmp_path / 'out'}", f"data.root={scene}", "use_timestamp=false", f"tag={tag}",
                 "trainer.enable_progress_bar=false", "trainer.run_test_after_fit=false", "system.export.formats=[]",
                 f"system.appearance.enabled={appearance}"]
    run_dir = run_experiment("train", load_config(config, overrides=overrides), [config], [])
    return float(json.loads((run_dir / "save" / "metrics.json").read_text())["val"]["psnr"])


@pytest.mark.slow
def test_tinted_training_photos_reconstruct_as_well_as_unaltered_ones(tmp_path):
    clean = write_photos(tmp_path / "clean", None)
    tinted = write_photos(tmp_path / "tinted", seed=7)
    # three one-thread trainings (the sample recipe's cpu_threads: 1) side by side, in processes of their own
    cases = [(clean, "clean", "false"),  # plain scores, whole held-out photos
             (tinted, "tinted-on", "true"),  # left-half protocol (lift3d.render.appearance)
             (tinted, "tinted-off", "false")]
    with ProcessPoolExecutor(len(cases), mp_context=multiprocessing.get_context("spawn")) as pool:
        baseline, on, off = [run.result() for run in [pool.submit(_val_psnr, tmp_path, *case) for case in cases]]
    figures = f"unaltered {baseline:.2f} dB, tinted with appearance {on:.2f} dB, without {off:.2f} dB"
    assert on > baseline - 1.5, figures
    assert on > off + 3.0, figures
