"""A tiny random-weight Stable Diffusion folder for tests: built locally, saved, never downloaded.

``build_tiny_sd(path)`` writes the diffusers layout (``unet/``, ``vae/``, ``text_encoder/``,
``tokenizer/``, ``scheduler/``, ``model_index.json``) with models of a few thousand weights, so tests
load it through the same ``from_pretrained`` code path users hit with real weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

TEXT_DIM = 32  # width of the tiny text encoder (the UNet's cross-attention dim)
LATENT_FACTOR = 8  # the VAE downsamples by 8 like SD's


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins of byte-level BPE: printable bytes are themselves, others are shifted."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in keep:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def write_tokenizer(folder: Path) -> int:
    """A CLIP tokenizer with single-byte tokens only (no merges); returns the vocabulary size."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {}
    for symbol in byte_symbols():
        vocab[symbol] = len(vocab)
    for symbol in byte_symbols():
        vocab[symbol + "</w>"] = len(vocab)
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    config = {
        "model_max_length": 77,
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "tokenizer_class": "CLIPTokenizer",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return len(vocab)


def build_tiny_sd(path: str | Path, prediction_type: str = "epsilon", seed: int = 0) -> Path:
    """Write a random-weight SD-shaped pipeline folder at ``path`` and return it."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    root = Path(path)
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(8, 16),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=TEXT_DIM,
        attention_head_dim=4,
        norm_num_groups=4,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(4, 4, 8, 8),
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1,
        norm_num_groups=2,
        sample_size=64,
    )
    vocab_size = write_tokenizer(root / "tokenizer")
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=vocab_size,
            hidden_size=TEXT_DIM,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            projection_dim=TEXT_DIM,
            bos_token_id=vocab_size - 2,
            eos_token_id=vocab_size - 1,
            pad_token_id=vocab_size - 1,
        )
    )
    scheduler = DDPMScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        prediction_type=prediction_type,
        clip_sample=False,
    )
    unet.save_pretrained(root / "unet")
    vae.save_pretrained(root / "vae")
    text_encoder.save_pretrained(root / "text_encoder")
    scheduler.save_pretrained(root / "scheduler")
    index = {
        "_class_name": "StableDiffusionPipeline",
        "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"],
        "text_encoder": ["transformers", "CLIPTextModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "scheduler": ["diffusers", "DDPMScheduler"],
    }
    (root / "model_index.json").write_text(json.dumps(index, indent=2))
    return root


_BUILT: dict[str, Path] = {}


def tiny_sd_path(prediction_type: str = "epsilon") -> Path:
    """A tiny SD folder built once per test session (and removed at exit)."""
    if prediction_type not in _BUILT:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix=f"lift3d-tiny-sd-{prediction_type}-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _BUILT[prediction_type] = build_tiny_sd(folder / "model", prediction_type)
    return _BUILT[prediction_type]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models are all overhead: one intra-op thread is faster, and immune to a busy shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
