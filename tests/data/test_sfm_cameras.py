"""Structure from motion on photo sets as people have them: one COLMAP camera per (upright size, EXIF camera),
EXIF focal lengths as priors, rotated photos seen upright, and failures explained from what COLMAP recorded."""

import json
import logging
import math
import shutil

import numpy as np
import pytest
from PIL import Image

from lift3d.cli import main
from lift3d.data.formats.transforms import read_transforms_json
from lift3d.data.posed_images import PosedImagesDataModule
from lift3d.data.sfm import SfmOptions, run_sfm, triangulate_points
from lift3d.data.sfm_photos import DEFAULT_FOCAL_FACTOR, Photo, group_cameras, read_photo, upright_folder
from lift3d.data.sfm_report import Evidence, describe, explain
from tests.sfm_scene import FLOOR_Z, pose_errors, reconstruction_c2w, write_mixed_photos, write_photos


def _save(path, size, make="", model="", focal_35mm=0, focal_mm=0.0, orientation=1, plane=None):
    """A JPG of ``size`` (stored width, height) with the given EXIF; ``plane`` = (FocalPlaneXResolution, unit, sensor px)."""
    exif = Image.Exif()
    if make:
        exif[0x010F], exif[0x0110] = make, model
    if orientation != 1:
        exif[0x0112] = orientation
    sub = {}  # the Exif sub-IFD, assigned whole (Pillow 10.0's get_ifd() of a new Exif hands out a copy)
    if focal_mm:
        sub[0x920A] = focal_mm
    if focal_35mm:
        sub[0xA405] = focal_35mm
    if plane:
        sub[0xA20E], sub[0xA210], sub[0xA002] = plane
    if sub:
        exif[0x8769] = sub
    pixels = np.random.default_rng(len(path.name)).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, exif=exif)
    return path.name


def test_read_photo_sizes_and_focal_priors(tmp_path):
    sideways = read_photo(tmp_path, _save(tmp_path / "p.jpg", (400, 300), "Apple", "iPhone 12", focal_35mm=26, focal_mm=4.2,
                                          orientation=6))
    assert (sideways.width, sideways.height, sideways.orientation) == (300, 400, 6)  # the upright size
    assert sideways.focal_px == pytest.approx(26 / math.hypot(36, 24) * 500)  # 35 mm equivalents scale the diagonal
    # focal length in mm and the sensor's pixels per mm (here a 5 um pitch: 200 px per mm at 4000 px), resized to 400 px
    plane = read_photo(tmp_path, _save(tmp_path / "c.jpg", (400, 300), "Canon", "EOS", focal_mm=50.0, plane=(200.0, 4, 4000)))
    assert plane.focal_px == pytest.approx(50 * 200 * 400 / 4000)
    bare = read_photo(tmp_path, _save(tmp_path / "b.png", (320, 240)))
    assert (bare.make, bare.focal_px, bare.orientation) == ("", 0.0, 1)
    with pytest.raises(Exception, match="cannot read the photo"):
        (tmp_path / "broken.jpg").write_bytes(b"not an image")
        read_photo(tmp_path, "broken.jpg")


def test_one_camera_per_size_and_exif_camera(tmp_path):
    photos = [read_photo(tmp_path, _save(tmp_path / f"{name}.jpg", size, *exif)) for name, size, exif in [
        ("land1", (400, 300), ("Apple", "iPhone 12", 26, 4.2)),
        ("port1", (400, 300), ("Apple", "iPhone 12", 26, 4.2, 6)),  # stored sideways: 300x400 upright
        ("land2", (400, 300), ("Apple", "iPhone 12", 26, 4.2)),
        ("other", (400, 300), ("Google", "Pixel 7", 24, 6.8)),  # same size, another phone
        ("bare1", (400, 300), ()),
        ("bare2", (400, 300), ()),
    ]]
    groups = group_cameras(photos)
    assert [g.names for g in groups] == [["land1.jpg", "land2.jpg"], ["port1.jpg"], ["other.jpg"], ["bare1.jpg", "bare2.jpg"]]
    landscape, portrait, other, bare = groups
    assert landscape.focal_px == pytest.approx(portrait.focal_px) and landscape.from_exif  # one lens, sizes swapped
    assert other.focal_px != pytest.approx(landscape.focal_px)
    assert bare.focal_px == DEFAULT_FOCAL_FACTOR * 400 and not bare.from_exif  # COLMAP's default, not a prior
    assert portrait.describe() == "300x400 Apple iPhone 12, 26 mm equiv." and bare.describe() == "400x300, no EXIF"


def test_rotated_photos_reach_colmap_upright(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    _save(images / "sideways.jpg", (40, 30), orientation=6)
    _save(images / "upright.jpg", (40, 30))
    photos = [read_photo(images, "sideways.jpg"), read_photo(images, "upright.jpg")]
    feed = upright_folder(images, photos, tmp_path / "work")
    assert feed == tmp_path / "work" and Image.open(feed / "sideways.jpg").size == (30, 40)
    assert Image.open(feed / "upright.jpg").size == (40, 30)
    assert upright_folder(images, photos[1:], tmp_path / "unused") == images  # nothing rotated: no copies


def test_reasons_come_from_colmap_records():
    photos = {"a.jpg": (640, 480), "b.jpg": (640, 480), "c.jpg": (640, 480), "tiny.jpg": (64, 48), "flat.jpg": (800, 600),
              "far.jpg": (640, 480), "x.jpg": (640, 480), "y.jpg": (640, 480), "lost.jpg": (640, 480)}
    groups = group_cameras([Photo(n, w, h, 1, "", "", 0.0, 0.0, 0.0) for n, (w, h) in photos.items()])
    evidence = Evidence({n: 2000 for n in photos if n != "lost.jpg"} | {"tiny.jpg": 12, "flat.jpg": 40})
    for first, second, inliers in [("a.jpg", "b.jpg", 400), ("b.jpg", "c.jpg", 300), ("far.jpg", "a.jpg", 20),
                                   ("x.jpg", "y.jpg", 200)]:
        evidence.verified.setdefault(first, {})[second] = inliers
        evidence.verified.setdefault(second, {})[first] = inliers
    evidence.keypoints["alone.jpg"] = 3000
    names = [*photos, "alone.jpg"]
    reasons = explain(names, {"a.jpg", "b.jpg", "c.jpg"}, evidence, groups)
    assert {reason: [entry.name for entry in entries] for reason, entries in reasons.items()} == {
        "unread": ["lost.jpg"], "tiny": ["tiny.jpg"], "plain": ["flat.jpg"], "alone": ["alone.jpg"],
        "separate": ["x.jpg", "y.jpg"], "weak": ["far.jpg"]}
    said, fixes = describe(reasons, {"a.jpg", "b.jpg", "c.jpg"}, groups)
    assert "tiny.jpg is tiny (64x48 px, 12 features)" in said and "flat.jpg shows too little texture (40 SIFT features)" in said
    assert "alone.jpg shares no matches with any other photo" in said and "far.jpg overlaps the other photos too little" in said
    assert "x.jpg, y.jpg match only photos that did not register either" in said and "COLMAP could not read lost.jpg" in said
    assert len(fixes) == 6
    # a camera none of whose photos registered, though they matched: said as such
    other = group_cameras([Photo(n, 320, 240, 1, "Pixel", "7", 6.8, 24.0, 300.0) for n in ("p1.jpg", "p2.jpg")])
    evidence.keypoints |= {"p1.jpg": 900, "p2.jpg": 900}
    evidence.verified["p1.jpg"], evidence.verified["p2.jpg"] = {"a.jpg": 30}, {"b.jpg": 25}
    reasons = explain(["a.jpg", "b.jpg", "c.jpg", "p1.jpg", "p2.jpg"], {"a.jpg", "b.jpg", "c.jpg"}, evidence, groups + other)
    said, _ = describe(reasons, {"a.jpg", "b.jpg", "c.jpg"}, groups + other)
    assert said.startswith("p1.jpg, p2.jpg overlap the other photos too little (best: 30 verified matches with a registered "
                           "photo; placing a photo takes 30 or more on points the model triangulated)")
    assert said.endswith("; none of the 2 photos of the camera 320x240 Pixel 7, 24 mm equiv. registered")



def test_no_model_says_what_the_first_pair_needs_against_what_was_found():
    """Nothing registered: few matches fall short of COLMAP's first pair; plenty of matches point at the views instead
    (photos from one spot), never "at most 2399 matches", which reads as plenty."""
    photos = {name: (640, 480) for name in ("a.jpg", "b.jpg", "c.jpg")}
    groups = group_cameras([Photo(n, w, h, 1, "", "", 0.0, 0.0, 0.0) for n, (w, h) in photos.items()])
    evidence = Evidence(dict.fromkeys(photos, 5000))
    for first, second, inliers in [("a.jpg", "b.jpg", 60), ("b.jpg", "c.jpg", 40)]:
        evidence.verified.setdefault(first, {})[second] = inliers
        evidence.verified.setdefault(second, {})[first] = inliers
    said, _ = describe(explain(list(photos), set(), evidence, groups), set(), groups)
    assert "(best: 60 verified matches in a pair; COLMAP starts from a pair with 100 or more)" in said
    evidence.verified = {"a.jpg": {"b.jpg": 2399}, "b.jpg": {"a.jpg": 2399, "c.jpg": 1800}, "c.jpg": {"b.jpg": 1800}}
    said, fixes = describe(explain(list(photos), set(), evidence, groups), set(), groups)
    assert said == ("a.jpg, b.jpg, c.jpg are seen from too nearly one spot to start a model (best: 2399 verified matches "
                    "in a pair, enough, but COLMAP starts from a pair seen from views 16 degrees or more apart)")
    assert "walk around it" in fixes[0]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A phone's landscape and (sideways-stored) portrait photos and a second camera's, their truth, and SfM's model."""
    root = tmp_path_factory.mktemp("mixed")
    truth = write_mixed_photos(root / "images")
    options = SfmOptions(num_threads=1)  # one thread: the same model on every run
    model = run_sfm(root, root / "images", options)
    import pycolmap

    return root, truth, pycolmap.Reconstruction(model)


def test_mixed_cameras_and_orientations_all_register(mixed):
    root, truth, reconstruction = mixed
    poses = reconstruction_c2w(reconstruction)
    assert sorted(poses) == sorted(truth) and len(truth) == 21  # every photo registered
    cameras = {(c.width, c.height): c for c in reconstruction.cameras.values()}
    assert sorted(cameras) == [(180, 240), (200, 150), (240, 180)]  # portrait, second camera, landscape
    for name in truth:
        camera = reconstruction.find_image_with_name(name).camera
        assert (camera.width, camera.height) == (truth[name].width, truth[name].height), name
        assert camera.mean_focal_length() == pytest.approx(truth[name].focal, rel=0.03), name
    names = sorted(poses)
    rotation, position, extent = pose_errors(np.stack([poses[n] for n in names]), np.stack([truth[n].c2w for n in names]))
    print(f"mixed cameras: rotation {rotation:.3f} deg, position {position / extent:.2%} of the extent")
    assert rotation < 1.0 and position < 0.02 * extent, (rotation, position, extent)
    # lift3d's COLMAP reader takes the model with its three cameras, every photo at its upright size
    module = PosedImagesDataModule({"root": str(root), "normalize": "none", "holdout_every": 0})
    assert module.capture.format == "colmap" and len(module.capture.frames) == 21
    for frame in module.capture.frames:
        assert (frame.lens.width, frame.lens.height) == (truth[frame.image.name].width, truth[frame.image.name].height)
        assert np.allclose(frame.c2w, poses[frame.image.name], atol=1e-5)


def test_a_photo_that_shares_nothing_is_named(mixed, tmp_path, caplog):
    root, _, _ = mixed
    shutil.copytree(root / "images", tmp_path / "images")
    noise = np.random.default_rng(0).integers(0, 255, (180, 240, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "images" / "stranger.jpg", quality=95)
    with caplog.at_level(logging.WARNING, logger="lift3d.sfm"):
        run_sfm(tmp_path, tmp_path / "images", SfmOptions(num_threads=1))
    assert "1 of 22 photos did not register and are left out: stranger.jpg shares no matches with any other photo" in caplog.text


def test_tiny_photos_say_so(tmp_path, capsys):
    write_photos(tmp_path / "images", n_views=6, resolution=48)
    assert main(["poses", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "registered only 0 of 6 photos" in err
    assert "photo_000.jpg, photo_001.jpg, photo_002.jpg, photo_003.jpg and 2 more" in err
    assert "are tiny (48x48 px and similar)" in err and "use larger photos" in err and "Traceback" not in err


def test_points_triangulated_at_known_poses_of_several_lenses(mixed, tmp_path, monkeypatch):
    root, truth, _ = mixed
    shutil.copytree(root / "images", tmp_path / "images")
    frames = [{"file_path": f"images/{name}", "transform_matrix": photo.c2w.tolist(), "fl_x": photo.focal, "fl_y": photo.focal,
               "cx": photo.width / 2, "cy": photo.height / 2, "w": photo.width, "h": photo.height}
              for name, photo in truth.items()]
    (tmp_path / "transforms.json").write_text(json.dumps({"frames": frames}))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    capture = read_transforms_json(tmp_path)
    assert len({f.lens for f in capture.frames}) == 3
    points, colors = triangulate_points(capture)
    assert len(points) > 100 and colors.dtype == np.uint8
    # where the toy and its floor are: on the floor plane (z = -0.9) or inside the toy's box
    on_floor = np.abs(points[:, 2] - FLOOR_Z) < 0.05
    in_toy = (np.abs(points[:, :2]).max(1) < 0.85) & (points[:, 2] > FLOOR_Z - 0.02) & (points[:, 2] < 0.62)
    assert (on_floor | in_toy).mean() > 0.9, (on_floor | in_toy).mean()
