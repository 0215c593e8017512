"""GPU checks of the guidance (run on the device: pytest -m gpu tests/guidance/test_gpu.py).

CPU twins: test_options.py (each option keeps the gradient), test_sds.py (exact
gradients, grad scaler), test_vsd.py (LoRA training)."""

from __future__ import annotations

import pytest
import torch

from tests.guidance.test_sds import views
from tests.tiny_diffusion import tiny_sd_path

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_fp32():
    """fp32 references in full fp32: cuDNN's default TF32 convolutions (10-bit mantissa) would make options that
    pick other conv algorithms (channels-last, fused QKV) differ by ~1e-3 for reasons unrelated to the option."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = False, False
    torch.set_float32_matmul_precision("highest")
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])


def make(tmp_path, kind: str = "sds", **overrides):
    from lift3d.guidance.sds import StableDiffusionGuidance
    from lift3d.guidance.vsd import VSDGuidance

    cfg = {"pretrained_model_name_or_path": str(tiny_sd_path()), "prompt": "a cat", "resolution": 64,
           "prompt_cache_dir": str(tmp_path / "cache"), **overrides}
    return (VSDGuidance if kind == "vsd" else StableDiffusionGuidance)(cfg).to(CUDA)


def cuda_views(elevation, azimuth) -> dict:
    batch = views(elevation, azimuth)
    return {**batch, "elevation_deg": batch["elevation_deg"].to(CUDA), "azimuth_deg": batch["azimuth_deg"].to(CUDA),
            "cameras": batch["cameras"].to(CUDA)}


def gradient(guidance, steps: int = 1) -> torch.Tensor:
    """The rgb gradient of the last of ``steps`` calls with fixed draws."""
    for _ in range(steps):
        torch.manual_seed(5)
        rgb = torch.rand(2, 16, 16, 3, device=CUDA, requires_grad=True)
        t, noise = torch.tensor([200, 800], device=CUDA), torch.randn(2, 4, 8, 8, device=CUDA)
        guidance(rgb, cuda_views([0, 0], [0, 100]), timesteps=t, noise=noise)["loss_sds"].backward()
    return rgb.grad


def close(got: torch.Tensor, expected: torch.Tensor, rel: float) -> None:
    torch.testing.assert_close(got.float(), expected.float(), rtol=rel, atol=rel * float(expected.abs().max()))


def test_half_precision_defaults_on_cuda(tmp_path):
    guidance = make(tmp_path)
    reference = gradient(make(tmp_path, dtype="fp32"))
    assert guidance.dtype == torch.float16
    got = gradient(guidance)
    assert guidance.unet.dtype == torch.float16 and next(guidance.unet.parameters()).is_cuda
    close(got, reference, 5e-2)
    close(gradient(make(tmp_path, dtype="bf16")), reference, 1e-1)


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_compile_matches_eager(tmp_path, cuda_graphs):
    reference = gradient(make(tmp_path, dtype="fp32"))
    compiled = make(tmp_path, dtype="fp32", compile=True, cuda_graphs=cuda_graphs)
    got = gradient(compiled, steps=3)  # the first calls compile / record
    assert compiled._unet_fn is not compiled.unet
    close(got, reference, 1e-3)


def test_eager_cuda_graphs_match_eager_and_capture_once(tmp_path):
    from lift3d.guidance.options import GraphedForward

    reference = gradient(make(tmp_path, dtype="fp32"))
    graphed = make(tmp_path, dtype="fp32", cuda_graphs=True)  # cuda_graphs without compile: the eager UNet captured
    got = gradient(graphed, steps=3)
    assert isinstance(graphed._unet_fn, GraphedForward) and len(graphed._unet_fn.graphs) == 1
    close(got, reference, 1e-4)
    # a call of another shape captures a second graph, and each replays its own
    torch.manual_seed(5)
    rgb = torch.rand(1, 16, 16, 3, device=CUDA, requires_grad=True)
    graphed(rgb, cuda_views([0], [30]), timesteps=torch.tensor([500], device=CUDA), noise=torch.randn(1, 4, 8, 8, device=CUDA))
    assert len(graphed._unet_fn.graphs) == 2
    close(gradient(graphed), reference, 1e-4)
    vsd = make(tmp_path, "vsd", dtype="fp32", cuda_graphs=True)  # LoRA toggles between calls: never captured
    vsd._ready()
    assert not isinstance(vsd._unet_fn, GraphedForward)


@pytest.mark.parametrize("mode", ["model", "sequential"])
def test_cpu_offload_matches_resident(tmp_path, mode):
    reference = gradient(make(tmp_path, dtype="fp32"))
    offloaded = make(tmp_path, dtype="fp32", cpu_offload=mode)
    got = gradient(offloaded)
    if mode == "model":
        assert next(offloaded.unet.parameters()).device.type == "cpu"  # back in CPU memory between calls
    close(got, reference, 1e-4)


def test_memory_options_match(tmp_path):
    reference = gradient(make(tmp_path, dtype="fp32", channels_last=False))
    for options in ({"attention_slicing": True}, {"vae_slicing": True}, {"fuse_qkv": True}, {"channels_last": True}):
        close(gradient(make(tmp_path, dtype="fp32", **options)), reference, 1e-3)


def test_exact_injection_under_cuda_grad_scaler(tmp_path):
    guidance = make(tmp_path, latent_input=True)
    start = torch.randn(1, 8, 8, 4, device=CUDA)
    t, noise = torch.tensor([300], device=CUDA), torch.randn(1, 4, 8, 8, device=CUDA)
    grads = []
    for scaled in (False, True):
        latents = torch.nn.Parameter(start.clone())
        loss = guidance(latents, cuda_views([0], [0]), timesteps=t, noise=noise)["loss_sds"]
        if scaled:
            optimizer = torch.optim.SGD([latents], lr=1.0)
            scaler = torch.amp.GradScaler("cuda", init_scale=2.0**16)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        grads.append(latents.grad.clone())
    assert grads[0].abs().sum() > 0 and torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("options", [{}, {"compile": True, "cuda_graphs": True}], ids=["eager", "compiled"])
def test_vsd_trains_in_fp16_on_cuda(tmp_path, options):
    guidance = make(tmp_path, "vsd", lora_lr=1e-2, **options)
    rgb = torch.rand(2, 16, 16, 3, device=CUDA, requires_grad=True)
    guidance(rgb, cuda_views([0, 20], [0, 120]))["loss_vsd"].backward()  # the first call places and casts the models
    before = {n: p.detach().clone() for n, p in guidance.unet.named_parameters()}
    for _ in range(3):
        out = guidance(rgb, cuda_views([0, 20], [0, 120]))
        out["loss_vsd"].backward()
    assert guidance.scaler.is_enabled() and all(p.dtype == torch.float32 for p in guidance.trainable.values())
    after = dict(guidance.unet.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before if n not in guidance.trainable)
    assert any(not torch.equal(before[n], after[n]) for n in guidance.trainable if "lora_B" in n)
    assert torch.isfinite(out["loss_lora"]) and torch.isfinite(rgb.grad).all()
