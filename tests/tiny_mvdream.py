"""A tiny random-weight MVDream-shaped folder for tests: the tiny Stable Diffusion folder of
``tests/tiny_diffusion.py`` with a UNet that has MVDream's camera embedding (``class_embed_type="projection"``
over the flattened 4x4 camera, 16 inputs), built locally, saved and loaded through the real path."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.tiny_diffusion import TEXT_DIM, build_tiny_sd


def tiny_mvdream_unet(seed: int = 0):
    """An SD-shaped UNet of a few thousand weights with a 16-input camera projection on the time embedding."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=TEXT_DIM, attention_head_dim=4, norm_num_groups=4,
        class_embed_type="projection", projection_class_embeddings_input_dim=16,
    )


def build_tiny_mvdream(path: str | Path, seed: int = 0) -> Path:
    """Write the tiny MVDream-shaped pipeline folder at ``path`` and return it."""
    root = build_tiny_sd(path, seed=seed)
    unet = tiny_mvdream_unet(seed)
    with torch.no_grad():  # a camera embedding that matters (random init is small): its output changes the result
        for param in unet.class_embedding.parameters():
            param.normal_(0.0, 0.5)
    unet.save_pretrained(root / "unet")
    return root


_BUILT: list[Path] = []


def tiny_mvdream_path() -> Path:
    """A tiny MVDream folder built once per test session (and removed at exit)."""
    if not _BUILT:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="lift3d-tiny-mvdream-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _BUILT.append(build_tiny_mvdream(folder / "model"))
    return _BUILT[0]
