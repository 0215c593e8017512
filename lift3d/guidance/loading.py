"""Load Stable Diffusion parts through diffusers/transformers, frozen, with errors that say what to do.

A model is a hub id (``stabilityai/stable-diffusion-2-1-base``) or a local folder in diffusers layout
(``unet/``, ``vae/``, ``text_encoder/``, ``tokenizer/``, ``scheduler/``). ``HF_HUB_OFFLINE=1`` (read at
call time) or ``local_files_only`` restricts loading to local files. When weights cannot be reached the
``ModelLoadError`` names the model, what was tried, and how to point lift3d at a local copy.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
          "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


class ModelLoadError(RuntimeError):
    """Diffusion weights that could not be loaded; the message says what was tried and how to fix it."""


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` asks for no network access (checked at call time, not import time)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve_dtype(name: str, cuda: bool) -> torch.dtype:
    """``auto`` -> fp16 on CUDA, fp32 on CPU; else fp32 / fp16 / bf16 (half types on CPU fall back to fp32)."""
    if name == "auto":
        return torch.float16 if cuda else torch.float32
    if name not in DTYPES:
        raise ValueError(f"guidance.dtype must be auto, fp32, fp16 or bf16, got '{name}'")
    dtype = DTYPES[name]
    if not cuda and dtype != torch.float32:
        log.info("guidance.dtype=%s needs a GPU; running the diffusion model in fp32 on the CPU", name)
        return torch.float32
    return dtype


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1


def _what_was_tried(name: str, subfolder: str, local_only: bool) -> str:
    folder = Path(name).expanduser()
    if folder.is_dir():
        return f"the local folder {folder.resolve()} (its '{subfolder}/' part)"
    if _looks_like_path(name):
        return f"the local folder {folder}, which does not exist"
    from huggingface_hub import constants

    where = f"the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    if local_only:
        reason = "HF_HUB_OFFLINE is set" if hub_offline() else "local_files_only is on"
        return f"the Hugging Face Hub id '{name}' in {where} only ({reason}, so the Hub was not contacted)"
    return f"the Hugging Face Hub id '{name}': {where}, then the Hub"


SD_PARTS = "unet/, vae/, text_encoder/, tokenizer/ and scheduler/"
CONFIG_KEY = "system.guidance.pretrained_model_name_or_path"  # the key that points a recipe's guidance at a model
_hub_checks: dict[str, str | None] = {}  # endpoint -> why it cannot be reached (None: reachable), once per process


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def hub_unreachable(timeout_s: float = 5.0) -> str | None:
    """Why the Hugging Face hub cannot be reached (no network, no name resolution, a refused connection), or None
    when it answers. One request without retries, through the hub client's own session (so its proxy settings
    apply); the answer is kept for the process, so a model's parts do not each wait."""
    endpoint = hub_endpoint()
    if endpoint not in _hub_checks:
        try:
            from huggingface_hub.utils import get_session

            get_session().head(endpoint, timeout=timeout_s)
            _hub_checks[endpoint] = None
        except Exception as error:  # noqa: BLE001  (any failure to get an answer means: not reachable from here)
            _hub_checks[endpoint] = f"{endpoint}: {network_reason(error)}"
    return _hub_checks[endpoint]


def network_reason(error: BaseException) -> str:
    """What a failed request says went wrong, in a few words: the system's own reason (``[Errno 111] Connection
    refused`` -> ``connection refused``), a timeout, or the error's type; never the HTTP client's wrapping text (one
    client calls every refused connection "Max retries exceeded", though it made one try)."""
    import re

    text = " ".join(str(error).split())
    found = re.findall(r"\[Errno -?\d+\] ([^'\"()\]]+)", text)
    if found:
        return found[-1].strip().rstrip(".").lower()
    if "timed out" in text.lower() or "timeout" in type(error).__name__.lower():
        return "timed out"
    return type(error).__name__


def load_part(loader: Callable[..., Any], name: str, subfolder: str, local_only: bool, parts: str = SD_PARTS, *,
              config_key: str = CONFIG_KEY, **kwargs: Any) -> Any:
    """``loader(name, subfolder=..., local_files_only=..., **kwargs)`` with failures as ``ModelLoadError``;
    ``parts`` names the subfolders a local copy of this kind of model holds and ``config_key`` the config key the
    message tells the user to set. A hub id on a machine that cannot reach the hub is looked up in the local cache
    only (no download retries), and a miss says so."""
    local = Path(name).expanduser().is_dir() or _looks_like_path(name)
    offline = None if local or local_only else hub_unreachable()
    try:
        return loader(name, subfolder=subfolder, local_files_only=local_only or offline is not None, **kwargs)
    except Exception as error:  # diffusers/transformers/huggingface_hub raise many types; all mean "not loadable"
        reason = str(error).strip().splitlines()[0].rstrip(".") if str(error).strip() else "no details"
        download = "" if local else f" (on a machine with internet, `hf download {name} --local-dir /path/to/folder` makes one)"
        if offline is not None:
            from huggingface_hub import constants

            raise ModelLoadError(
                f"cannot reach the Hugging Face hub to download {name} ({offline}), and its {subfolder}/ is not in the "
                f"local cache ({constants.HF_HUB_CACHE}): pass a local diffusers folder holding {parts} with "
                f"{config_key}=/path/to/folder{download}, or connect this machine to the internet"
            ) from None
        raise ModelLoadError(
            f"could not load the diffusion model '{name}' ({subfolder}): tried {_what_was_tried(name, subfolder, local_only)}; "
            f"{type(error).__name__}: {reason}. To use a local copy, point lift3d at a diffusers folder holding "
            f"{parts}: {config_key}=/path/to/folder{download}."
        ) from error


def frozen(module: torch.nn.Module) -> torch.nn.Module:
    """The module in eval mode with no parameter requiring gradients."""
    module.requires_grad_(False)
    return module.eval()


class TextEncoder:
    """Tokenizer + CLIP text encoder: texts -> per-token embeddings [N, L, D] (the UNet's context)."""

    def __init__(self, tokenizer: Any, model: torch.nn.Module) -> None:
        self.tokenizer, self.model = tokenizer, model

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> Tensor:
        tokens = self.tokenizer(
            texts, padding="max_length", max_length=self.tokenizer.model_max_length, truncation=True, return_tensors="pt"
        )
        device = next(self.model.parameters()).device
        return self.model(tokens.input_ids.to(device))[0].float()


@dataclass
class DiffusionModels:
    """The parts a Stable Diffusion guidance runs: frozen UNet and VAE, the noise schedule, and a way
    to get the text encoder (loaded only when a prompt embedding is not cached, then released)."""

    unet: torch.nn.Module
    vae: torch.nn.Module | None  # None: a pixel-space model (DeepFloyd IF)
    alphas_cumprod: Tensor  # [T] float32
    prediction_type: str  # epsilon, v_prediction or sample (from the scheduler config)
    text_encoder: Callable[[torch.device, torch.dtype], Callable[[list[str]], Tensor]] | None  # TextEncoder factory
    model_key: str  # names the model in the prompt-embedding cache

    @classmethod
    def with_schedule(cls, unet: torch.nn.Module, vae: torch.nn.Module | None, scheduler: Any,
                      text_encoder: Callable[..., Any] | None, key: str) -> DiffusionModels:
        """The parts, with the noise schedule and prediction type read from a diffusers scheduler."""
        return cls(unet=unet, vae=vae, alphas_cumprod=scheduler.alphas_cumprod.float(),
                   prediction_type=str(scheduler.config.prediction_type), text_encoder=text_encoder, model_key=key)


def model_key(name: str) -> str:
    """A stable name for the prompt cache: the absolute path of a local folder, else the hub id."""
    folder = Path(name).expanduser()
    return str(folder.resolve()) if folder.is_dir() else name


def load_stable_diffusion(name: str, dtype: torch.dtype, variant: str | None = None,
                          local_files_only: bool = False) -> DiffusionModels:
    """Load UNet, VAE and scheduler of ``name`` (hub id or folder) on the CPU in ``dtype``, frozen."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel

    local_only = local_files_only or hub_offline()
    weights = {"torch_dtype": dtype, **({"variant": variant} if variant else {})}
    scheduler = load_part(DDPMScheduler.from_pretrained, name, "scheduler", local_only)
    unet = frozen(load_part(UNet2DConditionModel.from_pretrained, name, "unet", local_only, **weights))
    vae = frozen(load_part(AutoencoderKL.from_pretrained, name, "vae", local_only, **weights))

    def text_encoder(device: torch.device, dtype: torch.dtype) -> TextEncoder:
        from transformers import CLIPTextModel, CLIPTokenizer

        tokenizer = load_part(CLIPTokenizer.from_pretrained, name, "tokenizer", local_only)
        model = load_part(CLIPTextModel.from_pretrained, name, "text_encoder", local_only,
                          **({"variant": variant} if variant else {}))
        return TextEncoder(tokenizer, frozen(model).to(device=device, dtype=dtype))

    return DiffusionModels.with_schedule(unet, vae, scheduler, text_encoder, model_key(name))
