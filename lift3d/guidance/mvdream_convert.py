"""Make the diffusers-format MVDream folder the ``mvdream`` guidance loads, from MVDream's released UNet weights.

MVDream ships its UNet in the original (LDM) layout: ``sd-v2.1-base-4view.pt`` (keys ``model.diffusion_model.*``;
huggingface.co/MVDream/MVDream), and community diffusers ports (e.g. ashawkey/mvdream-sd2.1-diffusers) keep the
same keys without the prefix in ``unet/diffusion_pytorch_model.safetensors`` beside a standard ``vae/``,
``text_encoder/``, ``tokenizer/`` and ``scheduler/``. MVDream fine-tunes only the UNet: its VAE and OpenCLIP text
encoder are Stable Diffusion 2.1's. This converts the UNet with diffusers' own LDM converter (``camera_embed`` is
the ``label_emb`` MLP of ``class_embed_type="projection"``) into a ``UNet2DConditionModel`` and takes the other
parts from a diffusers folder or hub id (``--base``):

    python -m lift3d.guidance.mvdream_convert sd-v2.1-base-4view.pt /path/to/mvdream --base stabilityai/stable-diffusion-2-1-base
    python -m lift3d.guidance.mvdream_convert /path/to/mvdream-sd2.1-diffusers /path/to/mvdream     (a community port)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from lift3d.guidance.loading import ModelLoadError, hub_offline, load_part
from lift3d.guidance.multiview import CAMERA_DIM

LDM_PREFIX = "model.diffusion_model."
MVDREAM_SD21_UNET: dict[str, Any] = {  # SD 2.1-base's UNet (MVDream's sd-v2-base.yaml) with the camera MLP
    "sample_size": 32, "in_channels": 4, "out_channels": 4, "flip_sin_to_cos": True, "freq_shift": 0,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "block_out_channels": [320, 640, 1280, 1280], "layers_per_block": 2, "cross_attention_dim": 1024,
    "attention_head_dim": [5, 10, 20, 20], "use_linear_projection": True, "norm_num_groups": 32,
    "class_embed_type": "projection", "projection_class_embeddings_input_dim": CAMERA_DIM,
}


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from a .safetensors file or a weights-only torch file (a ``state_dict`` entry is unwrapped)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: give MVDream's sd-v2.1-base-4view.pt or a folder with unet/")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)  # never unpickle code
    return state.get("state_dict", state)


def unet_from_ldm(state: dict[str, torch.Tensor], config: dict[str, Any] | None = None) -> torch.nn.Module:
    """MVDream's UNet weights in the LDM layout (with or without ``model.diffusion_model.``) as a diffusers
    ``UNet2DConditionModel`` of ``config`` (default: SD 2.1-base's with the 16-input camera projection)."""
    from diffusers import UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    config = dict(config or MVDREAM_SD21_UNET)
    if not any(key.startswith(LDM_PREFIX) for key in state):
        state = {LDM_PREFIX + key: value for key, value in state.items()}
    if f"{LDM_PREFIX}camera_embed.0.weight" not in state:
        raise ModelLoadError("these UNet weights have no camera_embed (MVDream's camera MLP): not an MVDream checkpoint")
    renamed = {key.replace(f"{LDM_PREFIX}camera_embed.", f"{LDM_PREFIX}label_emb.0."): value for key, value in state.items()}
    unet = UNet2DConditionModel(**config)
    try:
        converted = convert_ldm_unet_checkpoint(renamed, config)
        missing, unexpected = unet.load_state_dict(converted, strict=False)
    except (KeyError, RuntimeError) as error:  # a key the converter expects is absent, or a weight of another shape
        reason = str(error).strip().splitlines()
        raise ModelLoadError(f"the MVDream UNet weights do not fit an SD 2.1-shaped UNet: {type(error).__name__}: "
                             f"{(reason[1] if len(reason) > 1 else reason[0]).strip() if reason else ''}") from error
    if missing or unexpected:
        raise ModelLoadError(f"the MVDream UNet weights do not fit an SD 2.1-shaped UNet: {len(missing)} missing "
                             f"(e.g. {missing[:2]}), {len(unexpected)} unexpected (e.g. {unexpected[:2]})")
    return unet


def convert_mvdream(source: str | Path, out: str | Path, base: str = "", dtype: torch.dtype = torch.float16,
                    unet_config: dict[str, Any] | None = None) -> Path:
    """Write the diffusers folder at ``out``: the UNet from ``source`` (an LDM checkpoint file, or a community port's
    folder whose ``unet/`` holds LDM keys), VAE, text encoder, tokenizer and scheduler from ``base`` (a diffusers
    folder or hub id; default: ``source`` when it is a folder)."""
    from diffusers import AutoencoderKL, DDPMScheduler
    from transformers import CLIPTextModel, CLIPTokenizer

    source, out = Path(source).expanduser(), Path(out).expanduser()
    if source.is_dir():
        files = sorted((source / "unet").glob("*.safetensors")) or sorted((source / "unet").glob("*.bin"))
        if not files:
            raise FileNotFoundError(f"{source / 'unet'} holds no .safetensors or .bin weights")
        weights = read_weights(files[0])
        base = base or str(source)
    else:
        weights = read_weights(source)
    if not base:
        raise ValueError("give --base: a diffusers folder or hub id of Stable Diffusion 2.1-base for the VAE, text encoder, "
                         "tokenizer and scheduler (MVDream keeps those of SD 2.1), e.g. stabilityai/stable-diffusion-2-1-base")
    unet = unet_from_ldm(weights, unet_config)
    local_only = hub_offline()
    vae = load_part(AutoencoderKL.from_pretrained, base, "vae", local_only)
    text_encoder = load_part(CLIPTextModel.from_pretrained, base, "text_encoder", local_only)
    tokenizer = load_part(CLIPTokenizer.from_pretrained, base, "tokenizer", local_only)
    scheduler_config = load_part(DDPMScheduler.load_config, base, "scheduler", local_only)
    scheduler = DDPMScheduler.from_config({**scheduler_config, "prediction_type": "epsilon"})  # MVDream: eps
    out.mkdir(parents=True, exist_ok=True)
    unet.to(dtype).save_pretrained(out / "unet")
    vae.to(dtype).save_pretrained(out / "vae")
    text_encoder.to(dtype).save_pretrained(out / "text_encoder")
    tokenizer.save_pretrained(out / "tokenizer")
    scheduler.save_pretrained(out / "scheduler")
    index = {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
             "vae": ["diffusers", "AutoencoderKL"], "text_encoder": ["transformers", "CLIPTextModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "scheduler": ["diffusers", "DDPMScheduler"]}
    (out / "model_index.json").write_text(json.dumps(index, indent=1))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="sd-v2.1-base-4view.pt (MVDream's release) or a community diffusers port's folder")
    parser.add_argument("out", help="the folder to write (then: system.guidance.pretrained_model_name_or_path=OUT)")
    parser.add_argument("--base", default="", help="diffusers folder or hub id for VAE, text encoder, tokenizer, scheduler")
    parser.add_argument("--fp32", action="store_true", help="save float32 weights (default float16)")
    args = parser.parse_args(argv)
    try:
        out = convert_mvdream(args.source, args.out, args.base, torch.float32 if args.fp32 else torch.float16)
    except (FileNotFoundError, ValueError, ModelLoadError) as error:
        print(f"mvdream_convert: {error}", file=sys.stderr)
        return 2
    print(f"wrote {out}: use it with system.guidance.pretrained_model_name_or_path={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
