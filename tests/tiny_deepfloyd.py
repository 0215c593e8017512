"""A tiny random-weight DeepFloyd IF stage I folder for tests: built locally, saved, never downloaded.

``build_tiny_if(path)`` writes IF's diffusers layout (``unet/``, ``scheduler/``, ``text_encoder/``,
``tokenizer/``, ``model_index.json``; no VAE): a pixel-space UNet with IF's block types, text projection,
attention pooling and 6 output channels (noise + learned variance), a 2-layer T5 encoder and a
character-level T5 tokenizer, so tests load it through the same ``from_pretrained`` path as real weights.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch

T5_DIM = 16  # width of the tiny T5 (IF's T5-v1.1-XXL: 4096)
IF_CROSS_DIM = 32  # the UNet's cross-attention width after its text projection (IF-I-XL: 2816; group_norm needs 32 | it)


def write_t5_tokenizer(folder: Path) -> int:
    """A T5 (unigram) tokenizer over single characters with IF's specials (<pad> 0, </s> 1, <unk> 2); its size."""
    # built with the tokenizers library and saved as tokenizer.json (read by AutoTokenizer with every transformers we
    # admit; transformers 4.x's T5Tokenizer cannot be built from a vocabulary without sentencepiece)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    letters = string.ascii_letters + string.digits + string.punctuation
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    vocab += [(c, -3.0) for c in letters] + [("\u2581" + c, -2.5) for c in string.ascii_letters]
    backend = Tokenizer(models.Unigram(vocab, unk_id=2))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                                        model_max_length=77)
    tokenizer.save_pretrained(folder)
    return len(vocab)


def tiny_if_unet_config() -> dict:
    """IF-I-XL's UNet layout (unet/config.json of DeepFloyd/IF-I-XL-v1.0) at a few thousand weights."""
    return {
        "sample_size": 8, "in_channels": 3, "out_channels": 6, "block_out_channels": [8, 16], "layers_per_block": 1,
        "down_block_types": ["ResnetDownsampleBlock2D", "SimpleCrossAttnDownBlock2D"],
        "up_block_types": ["SimpleCrossAttnUpBlock2D", "ResnetUpsampleBlock2D"],
        "mid_block_type": "UNetMidBlock2DSimpleCrossAttn", "cross_attention_dim": IF_CROSS_DIM,
        "encoder_hid_dim": T5_DIM, "encoder_hid_dim_type": "text_proj", "addition_embed_type": "text",
        "addition_embed_type_num_heads": 2, "attention_head_dim": 4, "norm_num_groups": 4, "act_fn": "gelu",
        "resnet_time_scale_shift": "scale_shift", "cross_attention_norm": "group_norm",
    }


def if_scheduler():
    """IF stage I's noise schedule: cosine betas, learned variance range, epsilon prediction."""
    from diffusers import DDPMScheduler

    return DDPMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2", variance_type="learned_range",
                         prediction_type="epsilon", thresholding=True, dynamic_thresholding_ratio=0.95, sample_max_value=1.5,
                         clip_sample=True, clip_sample_range=1.0)


def build_tiny_if(path: str | Path, seed: int = 0) -> Path:
    """Write a random-weight IF-stage-I-shaped folder at ``path`` and return it."""
    from diffusers import UNet2DConditionModel
    from transformers import T5Config, T5EncoderModel

    root = Path(path)
    torch.manual_seed(seed)
    vocab_size = write_t5_tokenizer(root / "tokenizer")
    text_encoder = T5EncoderModel(T5Config(vocab_size=vocab_size, d_model=T5_DIM, d_kv=4, d_ff=32, num_layers=2, num_heads=4,
                                           feed_forward_proj="gated-gelu", relative_attention_num_buckets=8,
                                           pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
    UNet2DConditionModel(**tiny_if_unet_config()).save_pretrained(root / "unet")
    text_encoder.save_pretrained(root / "text_encoder")
    if_scheduler().save_pretrained(root / "scheduler")
    index = {"_class_name": "IFPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
             "text_encoder": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
             "scheduler": ["diffusers", "DDPMScheduler"], "safety_checker": [None, None], "feature_extractor": [None, None],
             "watermarker": [None, None], "requires_safety_checker": False}
    (root / "model_index.json").write_text(json.dumps(index, indent=2))
    return root


_BUILT: list[Path] = []


def tiny_if_path() -> Path:
    """A tiny IF folder built once per test session (and removed at exit)."""
    if not _BUILT:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="lift3d-tiny-if-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _BUILT.append(build_tiny_if(folder / "model"))
    return _BUILT[0]
