"""TripoSR (Tripo AI and Stability AI, MIT license): one image -> a triplane NeRF in one forward pass.

Loads the release as published (``config.yaml`` + ``model.safetensors`` or ``model.ckpt``, from a hub id such
as ``stabilityai/TripoSR`` or a local folder) by its own weight names, into ``TripoSRNetwork`` (plain PyTorch
+ the ``transformers`` ViT). The image is prepared as TripoSR's own scripts do: the cut-out object cropped,
padded to a square it fills to ``foreground_ratio`` (0.85), composited on gray (0.5), resized to the config's
``cond_image_size`` (512). The result is a ``triplane-nerf`` field (``lift3d.fields.triplane``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.config import bounded
from lift3d.generators.base import GeneratedField, Generator, GeneratorConfig, GeneratorLoadError, InputView, resolve_dtype
from lift3d.generators.files import CONFIG_KEY, check_state, hub_offline, model_file, read_weights
from lift3d.generators.triposr_model import TripoSRArchitecture, TripoSRNetwork
from lift3d.registry import register

log = logging.getLogger(__name__)

RELEASED_CLASSES = {  # config.yaml's class names of the released architecture, the only one this module builds
    "image_tokenizer_cls": "tsr.models.tokenizers.image.DINOSingleImageTokenizer",
    "tokenizer_cls": "tsr.models.tokenizers.triplane.Triplane1DTokenizer",
    "backbone_cls": "tsr.models.transformer.transformer_1d.Transformer1D",
    "post_processor_cls": "tsr.models.network_utils.TriplaneUpsampleNetwork",
    "decoder_cls": "tsr.models.network_utils.NeRFMLP",
    "renderer_cls": "tsr.models.nerf_renderer.TriplaneNeRFRenderer",
}
# the ViT config of facebook/dino-vitb16 (TripoSR's image tokenizer), used when its config.json cannot be fetched
DINO_VITB16 = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
               "hidden_act": "gelu", "image_size": 224, "patch_size": 16, "num_channels": 3, "qkv_bias": True,
               "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
# ViT weight names as released (transformers 4.x) -> as transformers 5 names them; applied only where the installed
# ViTModel uses the new names
VIT_RENAMES = (
    (".encoder.layer.", ".layers."),
    (".attention.attention.query.", ".attention.q_proj."),
    (".attention.attention.key.", ".attention.k_proj."),
    (".attention.attention.value.", ".attention.v_proj."),
    (".attention.output.dense.", ".attention.o_proj."),
    (".intermediate.dense.", ".mlp.fc1."),
    (".output.dense.", ".mlp.fc2."),
)
WEIGHT_FILES = ("model.safetensors", "model.ckpt")


@dataclass
class TripoSRConfig(GeneratorConfig):
    """Where the TripoSR release is and how its input image is prepared."""

    pretrained_model_name_or_path: str = "stabilityai/TripoSR"  # hub id or local folder with config.yaml + weights
    # share of the square input image the object spans (TripoSR's default)
    foreground_ratio: float = bounded(0.85, above=0, high=1)
    background: float = bounded(0.5, low=0, high=1)  # gray level the cut-out is composited on (TripoSR's training renders)
    density_scale: float = bounded(1.0, above=0)  # the field's density_scale (TripoSR's densities read per scene unit)


def architecture(cfg: dict[str, Any], path: Path) -> TripoSRArchitecture:
    """The sizes of a released ``config.yaml`` (resolved), refusing another architecture by name."""
    for key, name in RELEASED_CLASSES.items():
        if cfg.get(key) != name:
            raise GeneratorLoadError(f"{path}: {key} is {cfg.get(key)!r}, not TripoSR's {name!r} (another model's config?)")
    try:
        tok, bb, post, dec, ren = (cfg[k] for k in ("tokenizer", "backbone", "post_processor", "decoder", "renderer"))
        if bb.get("activation_fn", "geglu") != "geglu" or ren.get("feature_reduction", "concat") != "concat":
            raise GeneratorLoadError(f"{path}: only geglu feed-forwards and concatenated plane features are TripoSR's")
        arch = TripoSRArchitecture(
            cond_image_size=int(cfg["cond_image_size"]), plane_size=int(tok["plane_size"]), num_channels=int(tok["num_channels"]),
            num_attention_heads=int(bb.get("num_attention_heads", 16)), attention_head_dim=int(bb.get("attention_head_dim", 88)),
            num_layers=int(bb.get("num_layers", 1)), cross_attention_dim=int(bb["cross_attention_dim"]),
            norm_num_groups=int(bb.get("norm_num_groups", 32)), out_channels=int(post["out_channels"]),
            n_neurons=int(dec["n_neurons"]), n_hidden_layers=int(dec["n_hidden_layers"]),
            decoder_activation=str(dec.get("activation", "relu")), radius=float(ren["radius"]),
            density_activation=str(ren.get("density_activation", "trunc_exp")), density_bias=float(ren.get("density_bias", -1.0)),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise GeneratorLoadError(f"{path} is not a TripoSR config.yaml: {type(error).__name__} {error}") from None
    if int(bb.get("in_channels", arch.num_channels)) != arch.num_channels or int(post["in_channels"]) != arch.num_channels \
            or int(dec["in_channels"]) != 3 * arch.out_channels:
        raise GeneratorLoadError(f"{path}: backbone/post_processor/decoder in_channels do not match tokenizer.num_channels and "
                                 "post_processor.out_channels")
    return arch


def release_config(arch: TripoSRArchitecture, vit: str | Path) -> str:
    """The ``config.yaml`` of a TripoSR release of the sizes ``arch`` (laid out as released: the official class
    names, an interpolation), its image tokenizer's ViT at ``vit``; tests and benchmarks write random releases."""
    c = RELEASED_CLASSES
    return f"""cond_image_size: {arch.cond_image_size}
image_tokenizer_cls: {c['image_tokenizer_cls']}
image_tokenizer:
  pretrained_model_name_or_path: "{vit}"
tokenizer_cls: {c['tokenizer_cls']}
tokenizer:
  plane_size: {arch.plane_size}
  num_channels: {arch.num_channels}
backbone_cls: {c['backbone_cls']}
backbone:
  in_channels: ${{tokenizer.num_channels}}
  num_attention_heads: {arch.num_attention_heads}
  attention_head_dim: {arch.attention_head_dim}
  num_layers: {arch.num_layers}
  cross_attention_dim: {arch.cross_attention_dim}
  norm_num_groups: {arch.norm_num_groups}
post_processor_cls: {c['post_processor_cls']}
post_processor:
  in_channels: {arch.num_channels}
  out_channels: {arch.out_channels}
decoder_cls: {c['decoder_cls']}
decoder:
  in_channels: {3 * arch.out_channels}
  n_neurons: {arch.n_neurons}
  n_hidden_layers: {arch.n_hidden_layers}
  activation: {arch.decoder_activation}
renderer_cls: {c['renderer_cls']}
renderer:
  radius: {arch.radius}
  feature_reduction: concat
  density_activation: {arch.density_activation}
  density_bias: {arch.density_bias}
  num_samples_per_ray: 128
"""


def vit_config(name: str, local_files_only: bool) -> Any:
    """The ViT config of the image tokenizer: ``config.json`` of a local folder or hub id. For ``facebook/dino-vitb16``
    (the release's) a copy in the local cache, else DINO ViT-B/16's own values without asking the hub: the weights come
    with TripoSR's, and an offline machine would otherwise wait on retries for one small file."""
    from transformers import ViTConfig

    dino = name == "facebook/dino-vitb16"
    try:
        return ViTConfig.from_pretrained(name, local_files_only=dino or local_files_only or hub_offline())
    except Exception as error:  # noqa: BLE001  (not found, not reachable, not a config: said below)
        if dino:
            return ViTConfig(**DINO_VITB16)
        raise GeneratorLoadError(f"could not read the image tokenizer's ViT config from {name!r} (image_tokenizer."
                                 f"pretrained_model_name_or_path in config.yaml): {str(error).splitlines()[0]}") from None


def released_name(name: str, new_vit_names: bool) -> str:
    """A module's weight name as TripoSR's checkpoint spells it."""
    if new_vit_names and name.startswith("image_tokenizer.model."):
        for old, new in reversed(VIT_RENAMES):
            name = name.replace(new, old)
    return name


def installed_name(name: str, new_vit_names: bool) -> str:
    """A released weight name as the installed modules spell it."""
    if new_vit_names and name.startswith("image_tokenizer.model."):
        for old, new in VIT_RENAMES:
            name = name.replace(old, new)
    return name


def uses_new_vit_names(network: TripoSRNetwork) -> bool:
    """Whether the installed transformers names ViT weights ``layers.N.attention.q_proj`` (5.x) rather than as released."""
    return any(k.startswith("layers.") for k in network.image_tokenizer.model.state_dict())


def released_state_dict(network: TripoSRNetwork) -> dict[str, Tensor]:
    """The network's weights under the released names (what ``model.safetensors`` holds)."""
    new = uses_new_vit_names(network)
    return {released_name(k, new): v for k, v in network.state_dict().items()}


def build_network(folder_config: dict[str, Any], path: Path, local_files_only: bool) -> TripoSRNetwork:
    """A randomly initialized network of the architecture a resolved ``config.yaml`` describes."""
    arch = architecture(folder_config, path)
    tokenizer = folder_config.get("image_tokenizer") or {}
    vit = vit_config(str(tokenizer.get("pretrained_model_name_or_path", "facebook/dino-vitb16")), local_files_only)
    if vit.hidden_size != arch.cross_attention_dim:
        raise GeneratorLoadError(f"{path}: backbone.cross_attention_dim {arch.cross_attention_dim} differs from the ViT's "
                                 f"hidden size {vit.hidden_size}")
    return TripoSRNetwork(arch, vit)


def read_config(path: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[return-value]
    except Exception as error:  # noqa: BLE001
        raise GeneratorLoadError(f"{path} is not a readable config.yaml: {str(error).splitlines()[0]}") from None


def load_triposr(name: str, local_files_only: bool = False) -> TripoSRNetwork:
    """The released TripoSR of ``name`` (hub id or folder) with its weights, on the CPU in fp32, eval mode."""
    config_path = model_file(name, ("config.yaml",), local_files_only)
    weights_path = model_file(name, WEIGHT_FILES, local_files_only)
    network = build_network(read_config(config_path), config_path, local_files_only)
    found = read_weights(weights_path)
    new = uses_new_vit_names(network)
    expected = {released_name(k, new): tuple(v.shape) for k, v in network.state_dict().items()}
    check_state(weights_path, found, expected)
    network.load_state_dict({installed_name(k, new): v.float() for k, v in found.items()})
    return network.eval().requires_grad_(False)


def prepare_image(rgba: Tensor, size: int, foreground_ratio: float = 0.85, background: float = 0.5) -> Tensor:
    """A cut-out [H, W, 4] (0..1, straight alpha) -> TripoSR's input [size, size, 3]: the object's box padded to a
    square, then to side / ``foreground_ratio``, composited on gray ``background``, resized (antialiased bilinear)."""
    if rgba.ndim != 3 or rgba.shape[-1] != 4:
        raise ValueError(f"the generator takes an RGBA cut-out [H, W, 4], got shape {tuple(rgba.shape)}")
    if not 0 < foreground_ratio <= 1:
        raise ValueError(f"foreground_ratio must be in (0, 1], got {foreground_ratio}")
    ys, xs = torch.nonzero(rgba[..., 3] > 0, as_tuple=True)
    if len(xs) == 0:
        raise ValueError("the image's alpha is empty: there is no object to make 3D")
    crop = rgba[int(ys.min()):int(ys.max()) + 1, int(xs.min()):int(xs.max()) + 1]
    side = max(crop.shape[0], crop.shape[1])
    canvas_side = int(side / foreground_ratio)
    canvas = torch.zeros(canvas_side, canvas_side, 4, dtype=rgba.dtype, device=rgba.device)
    top, left = (canvas_side - crop.shape[0]) // 2, (canvas_side - crop.shape[1]) // 2
    canvas[top:top + crop.shape[0], left:left + crop.shape[1]] = crop
    rgb = canvas[..., :3] * canvas[..., 3:] + background * (1 - canvas[..., 3:])
    resized = F.interpolate(rgb.permute(2, 0, 1)[None].float(), (size, size), mode="bilinear", align_corners=False,
                            antialias=True)
    return resized[0].permute(1, 2, 0).clamp(0, 1)


@register("triposr")
class TripoSRGenerator(Generator):
    """TripoSR: ``generate(rgba)`` -> a ``triplane-nerf`` field of the object, seen from +x (azimuth 0, elevation 0)."""

    Config = TripoSRConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.network: TripoSRNetwork | None = None
        self.dtype = torch.float32

    def load(self, device: torch.device | str = "cpu") -> TripoSRGenerator:
        device = torch.device(device)
        self.dtype = resolve_dtype(self.cfg.dtype, device)
        if self.network is None:
            self.network = load_triposr(self.cfg.pretrained_model_name_or_path, self.cfg.local_files_only)
            log.info("loaded TripoSR from %s (%s)", self.cfg.pretrained_model_name_or_path, CONFIG_KEY)
        self.network.to(device=device, dtype=self.dtype)
        return self

    def preprocess(self, rgba: Tensor) -> Tensor:
        assert self.network is not None, "call load() first"
        return prepare_image(rgba, self.network.arch.cond_image_size, self.cfg.foreground_ratio, self.cfg.background)

    @torch.no_grad()
    def triplanes(self, images: Tensor) -> Tensor:
        """Prepared images [B, S, S, 3] in 0..1 -> triplanes [B, 3, C', 2P, 2P] (fp32)."""
        if self.network is None:
            raise RuntimeError("TripoSRGenerator.load() must run before generating")
        device = next(self.network.parameters()).device
        return self.network(images.permute(0, 3, 1, 2).to(device=device, dtype=self.dtype)).float()

    def field_config(self) -> dict[str, Any]:
        """The ``triplane-nerf`` config of this release's triplane and decoder."""
        assert self.network is not None
        a = self.network.arch
        return {"radius": a.radius, "plane_channels": a.out_channels, "plane_size": 2 * a.plane_size,
                "n_neurons": a.n_neurons, "n_hidden_layers": a.n_hidden_layers, "decoder_activation": a.decoder_activation,
                "density_activation": "trunc_exp" if a.density_activation == "exp" else a.density_activation,
                "density_bias": a.density_bias, "density_scale": self.cfg.density_scale}

    def generate(self, rgba: Tensor) -> GeneratedField:
        if self.network is None:
            self.load()
        planes = self.triplanes(self.preprocess(rgba)[None])[0]
        decoder = {f"decoder.{k}": v.detach().float().clone() for k, v in self.network.decoder.state_dict().items()}
        return GeneratedField("triplane-nerf", self.field_config(), {"triplane": planes, **decoder}, InputView())
