"""The Triton occupancy march (the renderer's fast path on CUDA) against the PyTorch ops it replaces: in Triton's
interpreter on the CPU, and on the GPU through the renderer."""

import textwrap

import pytest
import torch

from lift3d.registry import find
from tests.conftest import run_in_triton_interpreter
from tests.render.volume.test_rendering import _rays, make_renderer

MARCH_CHECK = textwrap.dedent(
    """
    import torch
    from lift3d.render.volume import march_triton
    from lift3d.render.volume.sampling import ray_box
    # random rays through random grids: some start inside the box, some miss it, steps end mid-way
    assert march_triton.compare(torch.device("cpu")) == 0
    assert march_triton.compare(torch.device("cpu"), n_rays=64, n_steps=301, resolution=7) == 0
    # a grid that is all empty or all occupied: nothing, or every step inside the box
    bbox = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    o = torch.tensor([[0.0, 0.0, -3.0], [0.2, -0.1, 0.0], [5.0, 5.0, 5.0]])
    d = torch.nn.functional.normalize(torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.5, 0.2], [1.0, 0.0, 0.0]]), dim=-1)
    near, far = ray_box(o, d, bbox)
    jitter = torch.tensor([1.0, 0.25, 0.5])
    for value in (False, True):
        occupied = torch.full((8**3,), value)
        args = (o, d, near, far, jitter, 0.05, 70, occupied, bbox, 8)
        fast = march_triton.occupied_steps(*args)
        assert fast.dtype == torch.bool and fast.shape == (3, 70)
        assert torch.equal(fast, march_triton.reference_steps(*args))
        assert fast.any() == value and not fast[2].any()  # the third ray misses the box
    print("ok")
    """
)


def test_the_triton_march_equals_the_pytorch_ops_in_the_interpreter():
    run_in_triton_interpreter(MARCH_CHECK, "the Triton march")


def test_fused_march_is_a_checked_option():
    field = find("implicit-volume")({"radius": 1.0})
    with pytest.raises(ValueError, match="fused_march must be one of auto, never"):
        make_renderer(field, fused_march="always")
    renderer = make_renderer(field)
    assert not renderer._fused_march(torch.device("cpu"))  # the CPU keeps the PyTorch ops


@pytest.mark.gpu
def test_the_renderer_marches_with_the_kernel_on_cuda_and_renders_the_same():
    """Training renders with sample budgets, fused march against the PyTorch ops: the same samples, so the same
    colors and the same table gradients."""
    from lift3d.render.volume import march_triton

    assert march_triton.available(torch.device("cuda"))
    # fused multiply-adds are off, but a midpoint within rounding of a cell face may still land on either side
    assert march_triton.compare(torch.device("cuda"), n_rays=4096, n_steps=513, resolution=64) <= 4096 * 513 * 1e-5
    torch.manual_seed(0)
    field = find("implicit-volume")({"radius": 1.0, "density_bias": 1.0}).cuda()
    o, d = (t.cuda() for t in _rays(4096))
    results = {}
    for mode in ("never", "auto"):
        renderer = make_renderer(field, randomized=False, sample_budget="auto", fused_march=mode,
                                 occupancy={"resolution": 32}).cuda().train()
        renderer.parts.material.cuda()
        renderer.parts.background.cuda()
        torch.manual_seed(1)  # the update draws random points in each cell: the same grid for both renderers
        renderer.occupancy.update(field.density, renderer.step_size, 0)
        for _ in range(2):  # the counts of the first calls size the budgets
            renderer.render_rays(o, d)
            torch.cuda.synchronize()
        field.zero_grad()
        out = renderer.render_rays(o, d)
        out["rgb"].sum().backward()
        assert renderer._fused_march(o.device) == (mode == "auto")
        results[mode] = (out["rgb"].detach(), out["num_samples"], field.encoding.table.grad.clone())
    differ = (results["auto"][0] - results["never"][0]).abs().amax(dim=-1) > 1e-6
    assert differ.float().mean() <= 1e-2  # rays with a candidate on a cell face, at most
    assert (results["auto"][1] - results["never"][1]).abs() <= 16 and results["never"][1] > 0
    torch.testing.assert_close(results["auto"][2], results["never"][2], atol=1e-4, rtol=1e-3)
