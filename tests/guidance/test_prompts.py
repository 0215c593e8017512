"""View-dependent prompts, embedding interpolation, Perp-Neg weights and the on-disk embedding cache."""

from __future__ import annotations

import math

import pytest
import torch

from lift3d.guidance.prompts import (
    DIRECTIONS,
    PromptConfig,
    PromptProcessor,
    describe_views,
    perp_neg_weights,
    view_weights,
    wrap_degrees,
)

# (elevation, azimuth) -> suffix with stable-dreamfusion's defaults: front arc 60 deg wide, overhead within 30 deg of the pole
GRID = [
    (0, 0, "front"), (0, 29.9, "front"), (0, -29.9, "front"), (0, 30.1, "side"), (0, -30.1, "side"),
    (0, 90, "side"), (0, -120, "side"), (0, 149.9, "side"), (0, 150.1, "back"), (0, 180, "back"),
    (0, -179, "back"), (0, 370, "front"), (0, -200, "back"), (59.9, 0, "front"), (60, 0, "overhead"),
    (85, 180, "overhead"), (-59.9, 90, "side"), (-60, 90, "bottom"), (30, 45, "side"),
]


def test_view_suffix_grid():
    cfg = PromptConfig(prompt="a cat")
    elevation = torch.tensor([g[0] for g in GRID], dtype=torch.float32)
    azimuth = torch.tensor([g[1] for g in GRID], dtype=torch.float32)
    assert describe_views(elevation, azimuth, cfg) == [f"a cat, {g[2]} view" for g in GRID]
    # other thresholds move the borders: a 120-degree front arc, overhead within 10 degrees
    wide = PromptConfig(prompt="a cat", front_angle_deg=120.0, overhead_angle_deg=10.0)
    views = describe_views(torch.tensor([0.0, 0.0, 70.0, 81.0]), torch.tensor([55.0, 125.0, 0.0, 0.0]), wide)
    assert views == ["a cat, front view", "a cat, back view", "a cat, front view", "a cat, overhead view"]


def test_wrap_degrees():
    angles = torch.tensor([-180.0, 180.0, 190.0, -190.0, 540.0, 0.0])
    assert wrap_degrees(angles).tolist() == [180.0, 180.0, -170.0, 170.0, 180.0, 0.0]


def test_view_interpolation_weights():
    elevation = torch.zeros(5)
    azimuth = torch.tensor([0.0, 45.0, -90.0, 135.0, 180.0])
    weights = view_weights(elevation, azimuth, 60.0, 30.0, interpolate=True)
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0], [0, 1, 0, 0, 0], [0, 0.5, 0.5, 0, 0], [0, 0, 1, 0, 0]], dtype=torch.float32
    )
    torch.testing.assert_close(weights, expected)
    polar = view_weights(torch.tensor([75.0, -75.0]), torch.tensor([45.0, 45.0]), 60.0, 30.0, interpolate=True)
    assert polar.argmax(-1).tolist() == [DIRECTIONS.index("overhead"), DIRECTIONS.index("bottom")]
    assert torch.allclose(weights.sum(-1), torch.ones(5))


def test_perp_neg_weights_by_hand():
    w = perp_neg_weights(torch.tensor([0.0, 0.0, 0.0, 80.0]), torch.tensor([0.0, 45.0, 180.0, 90.0]), 30.0, 2.0, 3.0)
    e = math.exp
    expected = torch.tensor(
        [[2 * e(-3), 2.0, 2.0], [2 * e(-1.5), 2 * e(-1.5), 2.0], [2.0, 2.0, 2 * e(-3)], [0.0, 0.0, 0.0]], dtype=torch.float32
    )
    torch.testing.assert_close(w, expected)


class CountingEncoder:
    """A fake text encoder: a fixed embedding per text; counts how often it is built and called."""

    built = 0

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        type(self).built += 1

    def __call__(self, texts: list[str]) -> torch.Tensor:
        out = []
        for text in texts:
            seed = sum(ord(c) * (i + 1) for i, c in enumerate(text)) % 10_000
            out.append(torch.randn(4, 3, generator=torch.Generator().manual_seed(seed)))
        return torch.stack(out)


def test_prompt_cache_hits(tmp_path):
    cfg = PromptConfig(prompt="a cat", prompt_cache_dir=str(tmp_path))
    CountingEncoder.built = 0
    first = PromptProcessor(cfg, "model-a", CountingEncoder)
    table = first.embeddings(torch.device("cpu"), torch.float32)
    assert CountingEncoder.built == 1 and first.encoder_calls == 1
    assert set(table) == {"uncond", "plain", *DIRECTIONS}
    assert len(list(tmp_path.glob("*.safetensors"))) == len(table)
    # a new processor for the same model and texts reads everything from disk
    second = PromptProcessor(cfg, "model-a", CountingEncoder)
    again = second.embeddings(torch.device("cpu"), torch.float32)
    assert CountingEncoder.built == 1 and second.encoder_calls == 0
    for name in table:
        assert torch.equal(table[name], again[name])
    # another model, or new text, misses: only the new text is encoded
    PromptProcessor(cfg, "model-b", CountingEncoder).embeddings(torch.device("cpu"), torch.float32)
    assert CountingEncoder.built == 2
    changed = PromptProcessor(PromptConfig(prompt="a cat", negative_prompt="blurry", prompt_cache_dir=str(tmp_path)), "model-a",
                              CountingEncoder)
    changed.embeddings(torch.device("cpu"), torch.float32)
    assert CountingEncoder.built == 3 and len(list(tmp_path.glob("*.safetensors"))) == 2 * len(table) + 1


def test_prompt_batch_picks_view_embeddings(tmp_path):
    cfg = PromptConfig(prompt="a cat", prompt_cache_dir="none", perp_neg=True)
    processor = PromptProcessor(cfg, "m", CountingEncoder)
    table = processor.embeddings(torch.device("cpu"), torch.float32)
    batch = {"elevation_deg": torch.tensor([0.0, 0.0, 75.0]), "azimuth_deg": torch.tensor([10.0, 170.0, 0.0])}
    prompts = processor(batch, 3, torch.device("cpu"), torch.float32)
    for i, name in enumerate(["front", "back", "overhead"]):
        assert torch.equal(prompts.cond[i], table[name])
        assert torch.equal(prompts.uncond[i], table["uncond"])
        assert torch.equal(prompts.negatives[i, 1], table["side"])
    assert prompts.negative_weights.shape == (3, 3) and prompts.negative_weights[2].abs().sum() == 0
    plain = PromptProcessor(PromptConfig(prompt="a cat", prompt_cache_dir="none", view_dependent_prompting=False), "m",
                            CountingEncoder)
    assert torch.equal(plain({}, 2, torch.device("cpu"), torch.float32).cond[1], table["plain"])


def test_prompt_errors():
    with pytest.raises(ValueError, match="prompt is empty"):
        PromptProcessor(PromptConfig(prompt="  "), "m", CountingEncoder)
    with pytest.raises(ValueError, match="view_dependent_prompting"):
        PromptProcessor(PromptConfig(prompt="x", perp_neg=True, view_dependent_prompting=False), "m", CountingEncoder)
    processor = PromptProcessor(PromptConfig(prompt="x", prompt_cache_dir="none"), "m", CountingEncoder)
    with pytest.raises(KeyError, match="elevation_deg"):
        processor({}, 1, torch.device("cpu"), torch.float32)
