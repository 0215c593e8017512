"""Converting MVDream's released UNet (LDM layout) to the diffusers folder the guidance loads: a tiny
MVDream-shaped UNet is written in the LDM layout by an independent key mapping (diffusers -> LDM, as
diffusers' convert_diffusers_to_original_stable_diffusion script maps it), converted back, and must compute
exactly what it computed before."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from lift3d.guidance.loading import ModelLoadError
from lift3d.guidance.mvdream import load_mvdream
from lift3d.guidance.mvdream_convert import LDM_PREFIX, convert_mvdream, main
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (one_thread: autouse fixture)
from tests.tiny_mvdream import tiny_mvdream_unet

RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1", "norm2": "out_layers.0",
          "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}
FIXED = {"time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
         "class_embedding.linear_1": "camera_embed.0", "class_embedding.linear_2": "camera_embed.2",
         "conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2"}


def to_ldm_key(key: str, layers: int, up_has_attention: list[bool]) -> str:
    """The original (LDM / MVDream) name of a diffusers UNet2DConditionModel weight."""
    for new, old in FIXED.items():
        if key.startswith(new + "."):
            return old + key[len(new):]
    if m := re.match(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.*)", key):
        i, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
        part = resnet(rest) if kind == "resnets" else rest
        return f"input_blocks.{(layers + 1) * i + j + 1}.{0 if kind == 'resnets' else 1}.{part}"
    if m := re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", key):
        return f"input_blocks.{(layers + 1) * (int(m[1]) + 1)}.0.op.{m[2]}"
    if m := re.match(r"mid_block\.resnets\.(\d+)\.(.*)", key):
        return f"middle_block.{2 * int(m[1])}.{resnet(m[2])}"
    if m := re.match(r"mid_block\.attentions\.0\.(.*)", key):
        return f"middle_block.1.{m[1]}"
    if m := re.match(r"up_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.*)", key):
        i, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
        part = resnet(rest) if kind == "resnets" else rest
        return f"output_blocks.{(layers + 1) * i + j}.{0 if kind == 'resnets' else 1}.{part}"
    if m := re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.*)", key):
        i = int(m[1])
        return f"output_blocks.{(layers + 1) * i + layers}.{2 if up_has_attention[i] else 1}.conv.{m[2]}"
    raise KeyError(key)


def resnet(rest: str) -> str:
    name, _, tail = rest.partition(".")
    return f"{RESNET[name]}.{tail}"


def ldm_state(unet) -> dict[str, torch.Tensor]:
    layers = unet.config.layers_per_block
    up_attention = ["CrossAttn" in kind for kind in unet.config.up_block_types]
    return {to_ldm_key(key, layers, up_attention): value.clone() for key, value in unet.state_dict().items()}


def outputs(unet) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    x, context = torch.randn(4, 4, 8, 8, generator=generator), torch.randn(4, 77, 32, generator=generator)
    camera = torch.randn(4, 16, generator=generator)
    with torch.no_grad():
        return unet(x, torch.tensor([10, 200, 500, 900]), encoder_hidden_states=context, class_labels=camera).sample


def test_original_checkpoint_converts_to_a_loadable_folder_that_computes_the_same(tmp_path):
    unet = tiny_mvdream_unet(seed=3)
    with torch.no_grad():
        for param in unet.parameters():  # no zero-initialized layers: every weight shows in the output
            param.add_(torch.randn_like(param) * 0.05)
    ldm = {LDM_PREFIX + key: value for key, value in ldm_state(unet).items()}
    ldm["first_stage_model.encoder.conv_in.weight"] = torch.zeros(1)  # other parts of the checkpoint are ignored
    torch.save(ldm, tmp_path / "sd-v2.1-base-4view.pt")
    out = convert_mvdream(tmp_path / "sd-v2.1-base-4view.pt", tmp_path / "converted", base=str(tiny_sd_path()),
                          dtype=torch.float32, unet_config=dict(unet.config))
    models = load_mvdream(str(out), torch.float32)
    models.unet.set_attn_processor({name: getattr(p, "inner", p) for name, p in models.unet.attn_processors.items()})
    torch.testing.assert_close(outputs(models.unet), outputs(unet))


def test_a_community_port_folder_converts_with_its_own_parts(tmp_path, capsys):
    from safetensors.torch import save_file

    unet = tiny_mvdream_unet(seed=4)
    port = tmp_path / "port"
    shutil.copytree(tiny_sd_path(), port)
    shutil.rmtree(port / "unet")
    (port / "unet").mkdir()
    save_file(ldm_state(unet), str(port / "unet" / "diffusion_pytorch_model.safetensors"))  # LDM keys, no prefix
    out = convert_mvdream(port, tmp_path / "out", dtype=torch.float32, unet_config=dict(unet.config))
    models = load_mvdream(str(out), torch.float32)
    models.unet.set_attn_processor({name: getattr(p, "inner", p) for name, p in models.unet.attn_processors.items()})
    torch.testing.assert_close(outputs(models.unet), outputs(unet))
    # the command line converts to SD 2.1's shape: tiny weights do not fit it, and it says so
    assert main([str(port), str(tmp_path / "cli")]) == 2
    assert "do not fit an SD 2.1-shaped UNet" in capsys.readouterr().err


def test_conversion_errors_say_what_is_wrong(tmp_path, capsys):
    assert main([str(tmp_path / "missing.pt"), str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    torch.save({"model.diffusion_model.time_embed.0.weight": torch.zeros(2)}, tmp_path / "sd.pt")
    with pytest.raises(ValueError, match="give --base"):
        convert_mvdream(tmp_path / "sd.pt", tmp_path / "out")
    with pytest.raises(ModelLoadError, match="no camera_embed"):
        convert_mvdream(tmp_path / "sd.pt", tmp_path / "out", base=str(tiny_sd_path()))
