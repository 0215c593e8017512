"""VGGT in lift3d: the released architecture's sizes and names, the math its layers share with the authors' code,
the photo preparation and its map back to each photo's pixels, and the checkpoint loading with its one-line refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from lift3d.generators.vggt import VggtPredictor, pose_method
from lift3d.generators.vggt_files import VggtWeightsError, find_weights, license_of, load_network, require_weights
from lift3d.generators.vggt_heads import pose_to_cameras
from lift3d.generators.vggt_images import prepare_photos
from lift3d.generators.vggt_layers import apply_rotary, patch_positions, rotary_tables
from lift3d.generators.vggt_model import VggtNetwork
from tests.tiny_vggt import SIZE, TINY, tiny_state, write_tiny_vggt


@pytest.fixture(autouse=True)
def no_weights_on_this_machine(tmp_path, monkeypatch):
    """Neither the environment nor the Hugging Face cache names VGGT weights unless a test puts them there."""
    import huggingface_hub.constants

    monkeypatch.delenv("LIFT3D_VGGT_WEIGHTS", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def test_the_released_sizes():
    """VGGT-1B as built here has the release's tensors: 909.1 M in the aggregator, 216.2 M in the camera head,
    32.7 M in the depth head (the checkpoint's own counts), under the release's names."""
    with torch.device("meta"):
        network = VggtNetwork()
    state = network.state_dict()
    counts = {head: sum(v.numel() for k, v in state.items() if k.startswith(head + "."))
              for head in ("aggregator", "camera_head", "depth_head")}
    assert counts == {"aggregator": 909_112_320, "camera_head": 216_174_610, "depth_head": 32_654_562}
    assert state["aggregator.patch_embed.pos_embed"].shape == (1, 1370, 1024)
    assert state["aggregator.frame_blocks.23.attn.q_norm.weight"].shape == (64,)
    assert state["camera_head.poseLN_modulation.1.weight"].shape == (6144, 2048)
    assert "depth_head.scratch.refinenet4.resConfUnit1.conv1.weight" not in state  # the coarsest block fuses nothing
    assert network.arch.dpt_layers == (4, 11, 17, 23)


def test_rotary_embedding_is_the_authors_2d_rope():
    """Half the channels turn with the row, half with the column, each as 1D RoPE (base 100) over its halves."""
    positions = patch_positions(2, 3, 5, 5, torch.device("cpu"))
    q = torch.randn(2, 4, positions.shape[1], 16, dtype=torch.float64)
    tables = rotary_tables(positions, 16)
    turned = apply_rotary(q.float(), tables).double()

    def rope_1d(x, pos):  # the textbook form: angle p * 100^(-2i/d) on channel pairs (i, i + d/2)
        d = x.shape[-1]
        freq = 100.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        angle = torch.cat([pos[..., None] * freq] * 2, -1)[:, None]
        return x * angle.cos() + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * angle.sin()

    rows, cols = positions[..., 0].double(), positions[..., 1].double()
    expected = torch.cat([rope_1d(q[..., :8], rows), rope_1d(q[..., 8:], cols)], -1)
    assert torch.allclose(turned, expected, atol=1e-5)
    assert torch.equal(positions[0, :5], torch.zeros(5, 2, dtype=positions.dtype))  # camera and register tokens


def test_pose_encoding_decodes_to_opencv_cameras():
    """[t, q (x y z w), fov_h, fov_w] -> world-to-camera [R | t] and a pinhole with its principal point centered."""
    angle = 0.3
    pose = torch.tensor([[0.1, -0.2, 0.3, 0.0, 0.0, math.sin(angle / 2), math.cos(angle / 2), 0.8, 1.0]])
    w2c, K = pose_to_cameras(pose, height=280, width=518)
    expected = torch.tensor([[math.cos(angle), -math.sin(angle), 0.0], [math.sin(angle), math.cos(angle), 0.0], [0, 0, 1]])
    assert torch.allclose(w2c[0, :, :3], expected, atol=1e-6) and torch.allclose(w2c[0, :, 3], pose[0, :3])
    assert K[0, 0, 0] == pytest.approx(259 / math.tan(0.5)) and K[0, 1, 1] == pytest.approx(140 / math.tan(0.4))
    assert (K[0, 0, 2], K[0, 1, 2]) == (259, 140)
    unnormalized = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.8, 1.0]])  # x y z w = (0, 0, 0, 2): no rotation
    assert torch.allclose(pose_to_cameras(unnormalized, height=280, width=518)[0][0, :, :3], torch.eye(3))


def _photo(path, width, height, seed, mode="RGB", orientation=1):
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 4 if mode == "RGBA" else 3), dtype=np.uint8)
    if mode == "RGBA":
        pixels[..., 3] = 255
        pixels[: height // 4, :, 3] = 0  # a transparent band: VGGT sees white there
    image = Image.fromarray(pixels, mode)
    if orientation != 1:
        exif = Image.Exif()
        exif[0x0112] = orientation
        image.save(path, exif=exif)
    else:
        image.save(path)
    return path


def test_photos_are_prepared_as_vggt_expects_and_mapped_back(tmp_path):
    """Crop: 518 wide, the height to a multiple of 14 and cropped to 518; pad: the longer side 518, squared on white;
    mixed sizes centered on white. The map back puts each photo pixel where the model sees it."""
    paths = [_photo(tmp_path / "wide.png", 1000, 750, 0), _photo(tmp_path / "tall.jpg", 300, 400, 1),
             _photo(tmp_path / "cut.png", 200, 100, 2, "RGBA")]
    crop = prepare_photos(paths, "crop")
    assert crop.images.shape == (3, 3, 518, 518)  # 392, 518 (690 cropped), 252 high: padded to the tallest
    assert crop.sizes.tolist() == [[1000, 750], [300, 400], [200, 100]]
    assert crop.scale[0].tolist() == pytest.approx([0.518, 392 / 750])
    assert crop.offset[1].tolist() == [0, (518 - 686) // 2]  # 400 * 518 / 300 = 690.7 -> 686, center-cropped
    assert crop.offset[0].tolist() == [0, (518 - 392) // 2]
    assert int(crop.valid[0].sum()) == 518 * 392 and int(crop.valid[1].sum()) == 518 * 518
    white = crop.images[2, :, 133 + 5, 10]  # the transparent band of cut.png, composited on white
    assert torch.allclose(white, torch.ones(3), atol=1e-3)
    pad = prepare_photos(paths, "pad")
    assert pad.images.shape == (3, 3, 518, 518) and pad.offset[1].tolist() == [(518 - 392) // 2, 0]
    # a model-pixel pinhole at the canvas center maps back to each photo's center, focal lengths by the scale
    K = np.tile(np.array([[400.0, 0, 259], [0, 400.0, 259], [0, 0, 1]]), (3, 1, 1))
    back = crop.photo_intrinsics(K)
    assert back[:, 0, 2] == pytest.approx([500, 150, 100], abs=1) and back[:, 1, 2] == pytest.approx([375, 200, 50], abs=1)
    assert back[0, 0, 0] == pytest.approx(400 / 0.518)
    rotated = prepare_photos([_photo(tmp_path / "turned.jpg", 300, 200, 3, orientation=6)], "crop", target=SIZE)
    assert rotated.sizes.tolist() == [[200, 300]]  # upright, as lift3d trains on it
    with pytest.raises(ValueError, match="multiple of 14"):
        prepare_photos(paths, "crop", target=50)


def test_a_tiny_release_loads_by_its_names_and_predicts_photos_of_mixed_sizes(tmp_path):
    weights = write_tiny_vggt(tmp_path / "release")  # model.pt, point and track heads included
    photos = tmp_path / "photos"
    photos.mkdir()
    names = [_photo(photos / n, w, h, i).name for i, (n, w, h) in enumerate([("a.png", 120, 90), ("b.jpg", 90, 120),
                                                                              ("c.png", 150, 60)])]
    prediction = VggtPredictor(weights, mode="crop", resolution=SIZE).predict(photos, names)
    assert prediction.sizes.tolist() == [[120, 90], [90, 120], [150, 60]]
    assert prediction.w2c.shape == (3, 3, 4) and prediction.intrinsics.shape == (3, 3, 3)
    assert prediction.depth.shape == prediction.confidence.shape == (3, 56, 56)  # 56 wide; b.jpg cropped to 56 high
    assert prediction.colors.shape == (3, 56, 56, 3) and prediction.colors.dtype == np.uint8
    rotations = prediction.w2c[:, :, :3]
    assert np.allclose(rotations @ np.swapaxes(rotations, 1, 2), np.eye(3), atol=1e-5)
    assert (prediction.depth > 0).all() and (prediction.confidence[2, :7] == 0).all()  # c.png's padding is not a photo
    assert prediction.intrinsics[:, 0, 2] == pytest.approx([60, 45, 75], abs=1)  # principal points at the photo centers
    # the same release as safetensors in bfloat16 (as repackaged copies ship it) loads and gives the same cameras
    from safetensors.torch import save_file

    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tiny_state().items()}, str(tmp_path / "model.safetensors"))
    network = load_network(tmp_path / "model.safetensors")
    assert network.arch == TINY and next(network.parameters()).dtype == torch.float32


def test_weights_are_found_where_they_are_named_and_in_the_hub_cache(tmp_path, monkeypatch):
    assert find_weights() is None
    with pytest.raises(VggtWeightsError) as missing:
        require_weights()
    message = str(missing.value)
    assert "\n" not in message and "facebook/VGGT-1B (CC-BY-NC-4.0" in message and "VGGT-1B-Commercial" in message
    assert "--vggt-weights" in message and "--method sfm" in message
    assert pose_method("auto") == ("sfm", None)
    folder = tmp_path / "release"
    weights = write_tiny_vggt(folder)
    assert find_weights(folder) == weights  # a folder holding model.pt
    monkeypatch.setenv("LIFT3D_VGGT_WEIGHTS", str(weights))
    assert pose_method("auto") == ("vggt", weights)
    monkeypatch.delenv("LIFT3D_VGGT_WEIGHTS")
    snapshot = tmp_path / "hf-cache" / "models--facebook--VGGT-1B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "model.pt").write_bytes(weights.read_bytes())
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    found = find_weights()
    assert found == snapshot / "model.pt" and "CC-BY-NC-4.0" in license_of(found)
    monkeypatch.setenv("LIFT3D_VGGT_WEIGHTS", "off")  # never VGGT unless named
    assert find_weights() is None and pose_method("auto") == ("sfm", None) and find_weights(weights) == weights
    with pytest.raises(VggtWeightsError, match="does not exist"):
        find_weights(tmp_path / "absent.pt")


@pytest.mark.parametrize("damage, said", [
    (lambda s: {k: v for k, v in s.items() if not k.startswith("aggregator.global_blocks.3.")},
     "18 missing (aggregator.global_blocks.3.attn.k_norm.bias"),
    (lambda s: {**s, "aggregator.scale_token": torch.zeros(1, 2, 1, 32)}, "1 unexpected (aggregator.scale_token)"),
    (lambda s: {**s, "camera_head.embed_pose.weight": torch.zeros(64, 10)}, "1 of another shape (camera_head.embed_pose"),
    (lambda s: {"decoder.weight": torch.zeros(3)}, "is not a VGGT checkpoint: it lacks aggregator.camera_token"),
])
def test_a_damaged_checkpoint_is_refused_in_one_line(tmp_path, damage, said):
    path = tmp_path / "model.pt"
    torch.save(damage(tiny_state()), path)
    with pytest.raises(VggtWeightsError) as refused:
        load_network(path)
    message = str(refused.value)
    assert said in message and str(path) in message and "\n" not in message
    assert "CC-BY-NC-4.0" in message and "LIFT3D_VGGT_WEIGHTS" in message


def test_an_unreadable_file_is_refused_without_unpickling(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(VggtWeightsError, match="not a readable checkpoint") as refused:
        load_network(path)
    assert "\n" not in str(refused.value)
