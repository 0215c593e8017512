"""GPU: the faster 3DGS step's options. Visible-only Adam replayed in a CUDA graph equals its PyTorch reference; the
recipe trains captured with a resolution schedule (one capture per size) and visible-only Adam."""

import json

import pytest
import torch

from lift3d.config import load_config
from lift3d.recipes import recipe_config
from lift3d.runs.runner import build_parts, build_trainer
from lift3d.systems.visible_adam import visible_adam_step
from tests.conftest import require_gpu_and_gsplat
from tests.systems.test_reconstruct_gaussians import QUIET

pytestmark = pytest.mark.gpu


def test_visible_adam_in_a_cuda_graph_equals_the_reference_and_skips_unseen_rows():
    if not torch.cuda.is_available():
        pytest.fail("this GPU test needs CUDA")
    torch.manual_seed(0)
    shapes = [(5000, 3), (5000,), (5000, 15, 3), (7, 4)]
    fast = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in shapes]
    slow = [torch.nn.Parameter(p.detach().clone()) for p in fast]
    optimizers = [torch.optim.Adam(ps, lr=0.01, eps=1e-15, fused=True) for ps in (fast, slow)]
    visible = torch.rand(5000, device="cuda") > 0.3
    first = [torch.randn_like(p) for p in fast]
    for params, optimizer in zip((fast, slow), optimizers):
        for p, g in zip(params, first):
            p.grad = g.clone()
        optimizer.step()  # torch's own first step: the state as the recipe's eager first step leaves it
        optimizer.param_groups[0]["capturable"] = True
        optimizer.param_groups[0]["lr"] = torch.tensor(0.01, device="cuda")
    grads = [torch.randn_like(p) for p in fast]
    for p, q, g in zip(fast, slow, grads):
        p.grad, q.grad = g.clone(), g.clone()
    before = [p.detach().clone() for p in fast]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # Triton compiles its kernel outside the capture (one step, undone below)
        saved = [(p.detach().clone(), {k: v.clone() for k, v in optimizers[0].state[p].items()}) for p in fast]
        visible_adam_step(optimizers[0], visible)
        for p, (value, state) in zip(fast, saved):
            p.data.copy_(value)
            for key, tensor in state.items():
                optimizers[0].state[p][key].copy_(tensor)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        visible_adam_step(optimizers[0], visible)
    for _ in range(3):
        graph.replay()
        visible_adam_step(optimizers[1], visible, use_triton=False)
    torch.cuda.synchronize()
    for p, q, old in zip(fast, slow, before):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
        if p.shape[0] == 5000:
            assert torch.equal(p.detach()[~visible], old[~visible])
            assert not torch.equal(p.detach()[visible], old[visible])
    assert float(optimizers[0].state[fast[0]]["step"]) == 4.0


def test_the_recipe_trains_captured_with_a_resolution_schedule_and_visible_adam(tmp_path, data_dir):
    require_gpu_and_gsplat()
    overrides = [f"data.root={data_dir / 'lego_tiny'}", f"output_root={tmp_path}", *QUIET, "trainer.max_steps=400",
                 "trainer.val_check_interval=400", "trainer.accelerator=gpu", "trainer.run_test_after_fit=false",
                 "data.val_split=train", "system.densify.refine_start=100", "system.densify.refine_every=100",
                 "system.densify.reset_every=250", "system.export.formats=[]", "system.gaussians.sh_degree_interval=100",
                 "checkpoint.every_n_train_steps=0", "system.resolution_schedule=[[0,4],[150,2],[250,1]]",
                 "system.optimizer.visible_adam=true"]
    cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=overrides)
    trainer = build_trainer(cfg, tmp_path / "run", train=True)
    datamodule, system = build_parts(cfg)
    system.set_save_dir(tmp_path / "run" / "save")
    sizes = []
    original = system._graphs._size_slots

    def size_slots(cameras, at_least=0):
        sizes.append((cameras.width, cameras.height))
        original(cameras, at_least)

    system._graphs._size_slots = size_slots
    trainer.fit(system, datamodule=datamodule)
    psnr = json.loads((tmp_path / "run" / "save" / "metrics.json").read_text())["val"]["psnr"]
    width = datamodule.train.cameras.width
    assert [w for w, _ in dict.fromkeys(sizes)] == [round(width / 4), round(width / 2), width], sizes
    assert system._graphs.optimizer_captured and system._graphs.step.replays > 350
    assert psnr > 20.0, psnr
