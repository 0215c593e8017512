"""Memory and speed options on CPU: each gives the same gradient as the plain path, or falls back."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.guidance.test_sds import make, views
from tests.tiny_diffusion import one_thread  # noqa: F401  (autouse fixture)

PLAIN = {"channels_last": False, "attention": "default", "vae_attention": "same"}


def gradient(guidance, autocast: torch.dtype | None = None) -> torch.Tensor:
    """d loss_sds / d rgb of a fixed draw; ``autocast``: the forward runs under the caller's CPU autocast."""
    torch.manual_seed(4)
    rgb = torch.rand(2, 16, 16, 3, requires_grad=True)
    t, noise = torch.tensor([200, 800]), torch.randn(2, 4, 8, 8)
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        loss = guidance(rgb, views([0, 0], [0, 100]), timesteps=t, noise=noise)["loss_sds"]
    loss.backward()  # outside autocast, as Lightning does
    return rgb.grad


@pytest.mark.parametrize(
    "options",
    [
        {"channels_last": True},
        {"attention": "sdpa"},
        {"vae_attention": "math"},
        {"vae_attention": "sdpa"},
        {"attention_slicing": True},
        {"vae_slicing": True},
        {"fuse_qkv": True},
        {"cpu_offload": "model"},
        {"cpu_offload": "sequential"},
        {"compile": True, "cuda_graphs": True},
        {"cuda_graphs": True},  # without compile: CUDA only (the GPU twin checks the replay); on CPU it runs eagerly
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_options_keep_the_gradient(tmp_path, options):
    expected = gradient(make(tmp_path, **PLAIN))
    got = gradient(make(tmp_path, **{**PLAIN, **options}))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))


def test_fallbacks_say_so(tmp_path, caplog, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "xformers" else real_find_spec(name, *a))
    with caplog.at_level(logging.INFO, logger="lift3d"):
        guidance = make(tmp_path, attention="xformers", compile=True, cpu_offload="none")
        gradient(guidance)
    text = caplog.text
    assert "xformers is not installed" in text and "compile needs CUDA" in text
    assert guidance._unet_fn is guidance.unet  # ran eagerly


def test_incompatible_options_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="defeats system.guidance.compile"):
        make(tmp_path, cpu_offload="model", compile=True)
    with pytest.raises(ValueError, match="pick one"):
        make(tmp_path, fuse_qkv=True, attention_slicing=True)
    with pytest.raises(ValueError, match="attention must be one of sdpa, xformers, default; got 'flash'"):
        make(tmp_path, attention="flash")
    with pytest.raises(ValueError, match="vae_attention must be one of math, sdpa, same"):
        make(tmp_path, vae_attention="flash")


def test_vae_attention_sets_the_vae_processors_only(tmp_path):
    from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

    guidance = make(tmp_path, attention="sdpa", vae_attention="math")
    vae_processors = list(guidance.vae.attn_processors.values())
    assert vae_processors and all(type(p) is AttnProcessor for p in vae_processors)
    assert all(type(p) is AttnProcessor2_0 for p in guidance.unet.attn_processors.values())


def test_compile_failure_falls_back_to_eager(caplog):
    """A compiler error (here: an inductor-style exception) switches to the eager function, once, with a warning."""
    from lift3d.guidance.options import CompileFallback, ModelOptionsConfig, compile_fn

    class InductorError(RuntimeError):
        pass

    calls = {"compiled": 0, "eager": 0}

    def compiled(x):
        calls["compiled"] += 1
        raise InductorError("no working C++ compiler")

    def eager(x):
        calls["eager"] += 1
        return x * 2

    wrapped = CompileFallback(compiled, eager, "unet")
    with caplog.at_level(logging.WARNING, logger="lift3d"):
        assert wrapped(torch.tensor(3.0)) == 6.0 and wrapped(torch.tensor(1.0)) == 2.0
    assert wrapped.failed and calls == {"compiled": 1, "eager": 2}
    assert caplog.text.count("running it eagerly") == 1

    def bad_input(x):  # an error of the inputs is not a compiler error: it propagates
        raise ValueError("wrong shape")

    with pytest.raises(ValueError, match="wrong shape"):
        CompileFallback(bad_input, eager, "unet")(torch.tensor(1.0))
    # compile_fn wraps only when compile_fallback is on; on CPU torch.compile itself is lazy (nothing compiles here)
    assert isinstance(compile_fn(eager, ModelOptionsConfig()), CompileFallback)
    assert not isinstance(compile_fn(eager, ModelOptionsConfig(compile_fallback=False)), CompileFallback)


def test_compile_mode_is_checked(tmp_path):
    with pytest.raises(ValueError, match="compile_mode"):
        make(tmp_path, compile=True, compile_mode="fastest")


def test_the_trainers_autocast_does_not_reach_the_frozen_models(tmp_path):
    # a bf16-mixed trainer runs training_step under autocast; the guidance keeps its own dtype (same gradient)
    guidance = make(tmp_path, **PLAIN)
    expected = gradient(guidance)
    got = gradient(guidance, autocast=torch.bfloat16)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7 * float(expected.abs().max()))


def test_graphed_forward_runs_eagerly_where_it_cannot_capture():
    """``GraphedForward`` captures only no-gradient CUDA calls: CPU calls and calls with gradients run the function
    itself and capture nothing (the capture and replay are checked on the device: tests/guidance/test_gpu.py)."""
    from lift3d.guidance.options import GraphedForward

    calls = []

    def fn(x, scale=1.0):
        calls.append(x.shape)
        return (x * scale,)

    graphed = GraphedForward(fn)
    x = torch.ones(3, requires_grad=True)
    out = graphed(x, scale=2.0)[0]
    out.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    with torch.no_grad():
        assert torch.equal(graphed(torch.ones(2), scale=3.0)[0], torch.full((2,), 3.0))
    assert len(calls) == 2 and graphed.graphs == {}
