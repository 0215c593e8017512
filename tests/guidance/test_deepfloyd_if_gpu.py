"""GPU checks of the DeepFloyd IF guidance (run on the device: pytest -m gpu tests/guidance/test_deepfloyd_if_gpu.py).

CPU twins: test_deepfloyd_if.py (exact SDS gradient, cached embeddings, the encoder released)."""

from __future__ import annotations

import pytest
import torch

from lift3d.guidance.deepfloyd_if import DeepFloydIFGuidance
from tests.tiny_deepfloyd import tiny_if_path

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def make(tmp_path, **overrides) -> DeepFloydIFGuidance:
    cfg = {"pretrained_model_name_or_path": str(tiny_if_path()), "prompt": "a cat", "prompt_cache_dir": str(tmp_path / "cache"),
           **overrides}
    return DeepFloydIFGuidance(cfg)


def gradient(guidance, steps: int = 1) -> torch.Tensor:
    """The rgb gradient of the last of ``steps`` calls with fixed draws."""
    for _ in range(steps):
        torch.manual_seed(5)
        rgb = torch.rand(2, 32, 32, 3, device=CUDA, requires_grad=True)
        t, noise = torch.tensor([200, 800], device=CUDA), torch.randn(2, 3, 64, 64, device=CUDA)
        batch = {"elevation_deg": torch.tensor([0.0, 0.0], device=CUDA), "azimuth_deg": torch.tensor([0.0, 100.0], device=CUDA)}
        guidance(rgb, batch, timesteps=t, noise=noise)["loss_sds"].backward()
    return rgb.grad


def close(got: torch.Tensor, expected: torch.Tensor, rel: float) -> None:
    torch.testing.assert_close(got.float(), expected.float(), rtol=rel, atol=rel * float(expected.abs().max()))


def test_prompts_are_embedded_on_the_gpu_before_the_unet_arrives(tmp_path, monkeypatch):
    import gc
    import weakref

    import transformers

    loaded: list[weakref.ref] = []
    load = transformers.T5EncoderModel.from_pretrained.__func__

    def tracked(cls, *args, **kwargs):
        model = load(cls, *args, **kwargs)
        loaded.append(weakref.ref(model))
        return model

    monkeypatch.setattr(transformers.T5EncoderModel, "from_pretrained", classmethod(tracked))
    guidance = make(tmp_path)
    guidance.to(CUDA)
    assert guidance.prompts.encoder_calls == 1 and next(guidance.unet.parameters()).device.type == "cpu"
    gc.collect()
    assert len(loaded) == 1 and loaded[0]() is None  # T5 ran on the GPU and is gone before the UNet arrives
    assert guidance.prompts.embeddings(CUDA, guidance.dtype)["plain"].is_cuda
    reference = gradient(make(tmp_path, dtype="fp32").to(CUDA))
    got = gradient(guidance)
    assert guidance.unet.dtype == torch.float16 and next(guidance.unet.parameters()).is_cuda
    close(got, reference, 5e-2)


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_compile_matches_eager(tmp_path, cuda_graphs):
    reference = gradient(make(tmp_path, dtype="fp32").to(CUDA))
    compiled = make(tmp_path, dtype="fp32", compile=True, cuda_graphs=cuda_graphs).to(CUDA)
    got = gradient(compiled, steps=3)  # the first calls compile / record
    assert compiled._unet_fn is not compiled.unet
    # Inductor reorders fp32 reductions (group norms, attention over the added text keys), so a few entries differ
    # by about 1e-3 of the largest gradient, with or without CUDA graphs; a wrong graph is off by O(1)
    close(got, reference, 2e-3)
