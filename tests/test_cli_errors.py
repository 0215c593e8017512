"""The user-facing error audit: every lift3d sub-command given a bad input prints one clear paragraph (what is
wrong, what to do) and no traceback; --debug shows the traceback. One row per case tried:

| command | bad input | what it says |
|---|---|---|
| train | a config file that does not exist | config file not found |
| train | YAML that does not parse | could not parse ... as YAML |
| train | an unknown key | unknown config key ... Did you mean |
| train | a number key given text | trainer.max_steps ... int |
| train | an override without '=' | overrides are key=value |
| train | a run folder instead of a config | is a run folder |
| train | --resume of a file that does not exist | checkpoint not found |
| train | --resume of a corrupt checkpoint | not a readable checkpoint |
| train | --resume of another recipe's checkpoint | was written by a ... run |
| train | an output folder that cannot be written | cannot write the run's folder |
| train | --gpus with letters | --gpus takes comma-separated GPU ids |
| reconstruct | a path that does not exist | does not exist |
| reconstruct | a folder with nothing lift3d reads | holds no poses lift3d can read |
| reconstruct | a transforms.json that is not JSON | is not valid JSON |
| reconstruct | two scene folders | give one scene folder |
| generate | no prompt | give a prompt |
| generate | --image of a missing file | no such file |
| generate | a text method with --image | makes 3D from text |
| generate | an override where the prompt goes | looks like an override |
| edit | a run that does not exist | no run at |
| edit | a folder that is not a run | not a lift3d run folder |
| edit | no instruction | give the edit instruction |
| edit | an override where the instruction goes | give the edit instruction |
| edit | an InstructPix2Pix folder that does not exist | could not load the diffusion model |
| export | an unknown format | unknown export format |
| export | the ambiguous format ply | is ambiguous |
| export | a 3DGS .ply instead of a checkpoint | is a 3DGS .ply, not a checkpoint |
| validate | no --resume | --resume |
| test | a run folder with no checkpoint | no checkpoint |
| poses | a file that is not a video | cannot read the video |
| view | a file that does not exist | nothing to view |
| view | a folder that is not a run | is not a run folder |
| view | a run folder with no checkpoint | has no checkpoint to show |
| view | a .glb that is not a mesh | cannot view |
| render | a camera path that does not exist | camera path not found |
| render | a path.json without keyframes | has no keyframes |
| render | a video name that is not .mp4 or .gif | write an .mp4 or a .gif |
| app upload | a .zip that is not a zip | not a readable .zip |
| app upload | nothing uploaded | upload photos |

More bad inputs, each one exit code 2, one line, no traceback, under a time limit (TRAINER_CASES and the
tests below them):

| command | bad input | what it says |
|---|---|---|
| train, reconstruct | trainer values Lightning refuses (max_steps < 0, devices=0, tpu, a strategy name) | trainer.KEY must be |
| train, reconstruct | --gpus without CUDA (or a GPU id this machine lacks) | asks for a CUDA GPU |
| train | a Lightning check lift3d does not make itself | Lightning refused the trainer settings |
| reconstruct | zero sizes: tile_size=0, init_points=0, refine_every=0, occupancy resolution 0, export sizes | KEY must be |
| reconstruct | partially NaN poses in a transforms file | not finite numbers |
| export, view | a .ply with no vertices | holds no Gaussians |
| export | a full disk while writing | No space left ... free some space |
| train | a full disk while checkpointing | the disk is full |
| render | --width 100000, --height 0 | must be 2..8192 pixels |
| view, app, train --viewer | --port 99999 | must be a TCP port 0..65535 |
| view | a --host that is not this machine's, or does not resolve | the viewer cannot listen |
| any | a path that is not UTF-8 | is not valid UTF-8 |
| poses | a file that is not a video | cannot read the video (no ffmpeg banner) |
| generate | no network, no local weights | cannot reach the Hugging Face hub ... system.guidance.pretrained_model_name_or_path= |
| python -m benchmarks step_floors | no CUDA | no CUDA GPU here ... --tiny |
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lift3d.cli import main
from lift3d.data.sample_scene import sample_scene_path
from lift3d.recipes import recipe_config
from tests.conftest import REPO
from tests.sample_runs import finished_sample_run

RECIPE = str(recipe_config("reconstruct-gaussians-sample"))


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A finished two-step sample reconstruction (its folder, config and checkpoint)."""
    root = tmp_path_factory.mktemp("audit")
    return finished_sample_run(root)


def _cases(tmp, run):
    """(arguments, what the message must say) for each bad input; files are made as needed."""
    (tmp / "bad.yaml").write_text("name: [unclosed\n")
    (tmp / "corrupt.ckpt").write_bytes(b"not a checkpoint at all")
    other = tmp / "other.ckpt"
    torch.save({"state_dict": {"field.weight": torch.zeros(1)}, "global_step": 1,
                "lift3d": {"system_type": "reconstruct-nerf"}}, other)
    (tmp / "empty").mkdir(exist_ok=True)
    (tmp / "badjson").mkdir(exist_ok=True)
    (tmp / "badjson" / "transforms.json").write_text("{ nope")
    (tmp / "notvideo.mp4").write_text("text")
    (tmp / "notmesh.glb").write_text("not a glb")
    (tmp / "nokeys.json").write_text('{"keyframes": []}')
    (tmp / "path.json").write_text(json.dumps({"keyframes": [{"c2w": torch.eye(4).tolist()}]}))
    from lift3d.gaussians.formats.ply import save_ply
    from lift3d.gaussians.model import GaussianModel

    model = GaussianModel({"sh_degree": 0})
    model.initialize(torch.rand(20, 3), torch.rand(20, 3))
    save_ply(tmp / "splats.ply", model)
    (tmp / "norun").mkdir(exist_ok=True)
    (tmp / "norun" / "configs").mkdir(exist_ok=True)
    shutil.copy(run / "configs" / "parsed.yaml", tmp / "norun" / "configs" / "parsed.yaml")
    parsed, ckpt = str(run / "configs" / "parsed.yaml"), str(run / "ckpts" / "last.ckpt")
    return [
        (["train", str(tmp / "missing.yaml")], "config file not found"),
        (["train", str(tmp / "bad.yaml")], "could not parse"),
        (["train", RECIPE, "trainer.max_stepz=3"], "Did you mean 'trainer.max_steps'"),
        (["train", RECIPE, "trainer.max_steps=abc"], "trainer.max_steps"),
        (["train", RECIPE, "data.root"], "overrides are key=value"),
        (["train", str(run)], "is a run folder"),
        (["train", RECIPE, "--resume", str(tmp / "nope.ckpt")], "checkpoint not found"),
        (["train", RECIPE, "--resume", str(tmp / "corrupt.ckpt")], "not a readable checkpoint"),
        (["validate", parsed, "--resume", str(other)], "was written by a reconstruct-nerf run"),
        (["train", RECIPE, "output_root=/proc/lift3d-cannot-write", "trainer.max_steps=1"], "cannot write the run's folder"),
        (["train", RECIPE, "--gpus", "a,b"], "--gpus takes comma-separated GPU ids"),
        (["reconstruct", str(tmp / "absent")], "does not exist"),
        (["reconstruct", str(tmp / "empty")], "holds no poses lift3d can read"),
        (["reconstruct", str(tmp / "badjson")], "is not valid JSON"),
        (["reconstruct", str(tmp / "empty"), str(tmp / "badjson")], "give one scene folder"),
        (["generate"], "give a prompt"),
        (["generate", "--image", str(tmp / "absent.png")], "no such file"),
        (["generate", "--image", str(sample_scene_path() / "train" / "r_0.png"), "--method", "dreamfusion"],
         "makes 3D from text"),
        (["generate", "trainer.max_steps=5"], "looks like an override"),
        (["edit", str(tmp / "absent"), "make it bronze"], "no run at"),
        (["edit", str(tmp / "empty"), "make it bronze"], "not a lift3d run folder"),
        (["edit", str(run)], "give the edit instruction"),
        (["edit", str(run), "trainer.max_steps=3"], "give the edit instruction"),
        (["edit", str(run), "make it bronze", f"system.editor.pretrained_model_name_or_path={tmp / 'no-ip2p'}",
          f"output_root={tmp}"], "could not load the diffusion model"),
        (["export", parsed, "--resume", ckpt, "--format", "usdz"], "unknown export format 'usdz'"),
        (["export", parsed, "--resume", ckpt, "--format", "ply"], "is ambiguous"),
        (["export", parsed, "--resume", str(tmp / "splats.ply"), "--format", "splat"], "is a 3DGS .ply, not a checkpoint"),
        (["validate", parsed], "--resume"),
        (["test", str(tmp / "norun")], "no checkpoint"),
        (["poses", str(tmp / "notvideo.mp4")], "cannot read the video"),
        (["view", str(tmp / "absent.ply")], "nothing to view"),
        (["view", str(tmp / "empty")], "is not a run folder"),
        (["view", str(tmp / "norun")], "has no checkpoint to show"),
        (["view", str(tmp / "notmesh.glb")], "cannot view"),
        (["render", str(run), "--path", str(tmp / "absent.json")], "camera path not found"),
        (["render", str(run), "--path", str(tmp / "nokeys.json")], "has no keyframes"),
        (["render", str(run), "--path", str(tmp / "path.json"), "--out", str(tmp / "video.avi")], "write an .mp4 or a .gif"),
        (["train", "configs/reconstruct-nerf-unbounded-cpu.yaml", f"data.root={sample_scene_path()}", f"output_root={tmp}",
          "system.field.contraction=ball"], "system.field.contraction must be one of none, cube, sphere; got 'ball'"),
        (["train", "configs/reconstruct-nerf-unbounded-cpu.yaml", f"data.root={sample_scene_path()}", f"output_root={tmp}",
          "system.renderer.disparity_from=0"], "needs renderer.disparity_from > 0"),
        (["train", "configs/mvdream-analytic.yaml", f"output_root={tmp}"],
         "random-views: data.reference_eval_split needs data.reference_scene"),
    ]


def test_every_bad_input_gets_one_clear_message(run_folder, tmp_path, capsys):
    cases = _cases(tmp_path, run_folder)
    assert len(cases) >= 20
    failures = []
    for args, expected in cases:
        try:
            code = main(args)
        except SystemExit as stop:  # argparse's own usage errors
            code = stop.code
        err = capsys.readouterr().err
        if code == 0 or expected not in err or "Traceback" in err or "internal error" in err:
            failures.append((args, expected, code, err[-600:]))
    assert not failures, json.dumps(failures, indent=1, default=str)


def test_app_uploads_are_audited_too(tmp_path):
    from lift3d.app.uploads import UploadError, prepare_scene

    (tmp_path / "junk.zip").write_bytes(b"junk")
    with pytest.raises(UploadError, match="not a readable .zip"):
        prepare_scene([tmp_path / "junk.zip"], tmp_path / "a")
    with pytest.raises(UploadError, match="upload photos"):
        prepare_scene([], tmp_path / "b")


def test_debug_shows_the_traceback(tmp_path, capsys):
    assert main(["--debug", "train", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "config file not found" in err


def test_a_bad_input_is_said_once_per_machine_not_by_every_gpu_process(tmp_path, capsys, monkeypatch):
    """Every DDP process meets the same bad config: the process of local rank 0 says it, the others exit 2 silently."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


# ----------------------------------------------------------------------------- under a time limit


class Hung(BaseException):
    """Raised by the alarm of ``time_limit``: a BaseException, so lift3d's own error handling cannot swallow it."""


@pytest.fixture
def time_limit():
    """Fails a case that runs longer than 120 s instead of letting it hang the suite (SIGALRM: Linux, main thread)."""
    def _alarm(signum, frame):
        raise Hung("the case ran past its time limit (a hang?)")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _fails_cleanly(args, capsys, expected: str | list[str]) -> str:
    """Run lift3d in-process; assert exit code 2, one ``lift3d: error:`` line holding ``expected``, no traceback;
    return everything it wrote to stderr."""
    try:
        code = main(args)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("lift3d: error:")]
    assert code == 2, (code, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert len(errors) == 1, err[-2000:]
    for text in [expected] if isinstance(expected, str) else expected:
        assert text in errors[0], err[-2000:]
    return err


NO_CUDA = not torch.cuda.is_available()
GPU_FLAG = "0" if NO_CUDA else "99"  # a GPU this machine does not have either way
GPU_MESSAGE = "asks for a CUDA GPU" if NO_CUDA else "this machine has"

TRAINER_CASES = [  # overrides of the sample reconstruction -> what the one line says
    (["trainer.max_steps=-5"], "trainer.max_steps must be a number >= 0 (or -1); got -5"),
    (["trainer.devices=0"], "trainer.devices must be a number of devices >= 1"),
    (["trainer.accelerator=tpu"], "trainer.accelerator must be one of auto, cpu, gpu"),
    (["trainer.strategy=foo"], "trainer.strategy 'foo' is not a Lightning strategy"),
    (["trainer.precision=17"], "trainer.precision must be one of"),
    (["trainer.limit_val_batches=-1"], "trainer.limit_val_batches must be"),
    (["trainer.val_check_interval=-3"], "trainer.val_check_interval must be"),
    (["trainer.num_sanity_val_steps=-5"], "trainer.num_sanity_val_steps must be"),
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val must be"),
    (["checkpoint.every_n_train_steps=-1"], "checkpoint.every_n_train_steps must be"),
    (["--gpus", GPU_FLAG], GPU_MESSAGE),
    (["--viewer", "--viewer-port", "99999"], "--viewer-port must be a TCP port 0..65535"),
    (["--viewer", "--viewer-host", "192.0.2.1"], "the viewer cannot listen on 192.0.2.1"),  # TEST-NET: nobody's address
    # zero and negative sizes of the parts, refused when the config loads (before anything is built)
    (["system.renderer.tile_size=0"], "system.renderer.tile_size must be a number >= 1; got 0"),
    (["system.renderer.tile_size=-4"], "system.renderer.tile_size must be a number >= 1; got -4"),
    (["system.renderer.chunk_elements=0"], "system.renderer.chunk_elements must be a number >= 1"),
    (["system.gaussians.init_points=0"], "system.gaussians.init_points must be a number >= 1"),
    (["system.gaussians.init_opacity=0"], "system.gaussians.init_opacity must be a number > 0 and < 1"),
    (["system.densify.refine_every=0"], "system.densify.refine_every must be a number >= 1"),
    (["system.densify.split_into=1"], "system.densify.split_into must be a number >= 2"),
    (["system.export.video_frames=0"], "system.export.video_frames must be a number >= 1"),
    (["system.export.video_width=100000"], "system.export.video_width must be a number >= 2 and <= 8192"),
    (["system.export.resolution=0"], "system.export.resolution must be a number >= 2"),
    (["system.export.render_batch=0"], "system.export.render_batch must be a number >= 1"),
    (["--method", "nerf", "system.renderer.steps_per_diagonal=0"], "system.renderer.steps_per_diagonal must be a number >= 1"),
    (["--method", "nerf", "system.renderer.occupancy.resolution=0"], "occupancy.resolution must be a number >= 1"),
]


@pytest.mark.parametrize(("extra", "expected"), TRAINER_CASES, ids=[" ".join(case[0]) for case in TRAINER_CASES])
def test_trainer_values_and_zero_sizes_are_one_line_errors(extra, expected, tmp_path, capsys, time_limit):
    _fails_cleanly(["reconstruct", f"output_root={tmp_path}", "trainer.max_steps=2", "trainer.enable_progress_bar=false",
                    *extra], capsys, expected)
    assert not list(tmp_path.rglob("*.ckpt"))  # refused before training, not after


def test_train_with_gpus_fails_before_the_config_is_used(tmp_path, capsys, time_limit):
    _fails_cleanly(["train", RECIPE, f"data.root={sample_scene_path()}", f"output_root={tmp_path}", "--gpus", GPU_FLAG],
                   capsys, GPU_MESSAGE)


def test_lightnings_own_refusals_are_user_errors_too(tmp_path, capsys, monkeypatch, time_limit):
    """A trainer value lift3d does not check itself still ends as one line naming Lightning's reason."""
    import lift3d.config.schema
    import lift3d.runs.runner

    monkeypatch.setattr(lift3d.runs.runner, "check_trainer", lambda cfg: None)
    monkeypatch.setattr(lift3d.config.schema, "check_message", lambda *args, **kwargs: None)  # no declared bounds either
    _fails_cleanly(["reconstruct", f"output_root={tmp_path}", "trainer.max_steps=-5"], capsys,
                   ["Lightning refused the trainer settings", "max_steps"])


def test_partially_nan_poses_are_refused_naming_the_frames(tmp_path, capsys, time_limit):
    scene = tmp_path / "scene"
    shutil.copytree(sample_scene_path(), scene)
    record = json.loads((scene / "transforms_train.json").read_text())
    record["frames"][3]["transform_matrix"][0][3] = float("nan")
    record["frames"][5]["transform_matrix"][2][1] = float("inf")
    (scene / "transforms_train.json").write_text(json.dumps(record))  # json writes NaN and Infinity, as numpy exports do
    _fails_cleanly(["reconstruct", str(scene), f"output_root={tmp_path}"], capsys, ["2 of 48 frames", "not finite numbers",
                                                                                      "r_3"])
    recipe = str(REPO / "lift3d" / "configs" / "reconstruct-gaussians-sample.yaml")
    _fails_cleanly(["train", recipe, f"data.root={scene}", f"output_root={tmp_path}"], capsys,  # the data module checks too
                   ["2 of 48 frames", "not finite numbers", "r_3"])


@pytest.fixture
def empty_ply(tmp_path) -> Path:
    """A 3DGS .ply with every property and no vertices (what a tool writes for an empty scene)."""
    import numpy as np
    from plyfile import PlyData, PlyElement

    names = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
             "rot_0", "rot_1", "rot_2", "rot_3"]
    path = tmp_path / "empty.ply"
    PlyData([PlyElement.describe(np.zeros(0, dtype=[(n, "f4") for n in names]), "vertex")]).write(str(path))
    return path


@pytest.mark.parametrize("command", [["export"], ["export", "--format", "spz"], ["view"]])
def test_a_zero_vertex_ply_is_refused(command, empty_ply, capsys, time_limit):
    _fails_cleanly([command[0], str(empty_ply), *command[1:]], capsys, "holds no Gaussians (0 vertices)")


def test_a_full_disk_while_exporting(tmp_path, capsys, monkeypatch, time_limit):
    import lift3d.export.formats as formats
    from lift3d.gaussians.formats.ply import save_ply
    from lift3d.gaussians.model import GaussianModel

    model = GaussianModel({"sh_degree": 0})
    model.initialize(torch.rand(20, 3), torch.rand(20, 3))
    save_ply(tmp_path / "splats.ply", model)

    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(formats, "write_splat", full)
    _fails_cleanly(["export", str(tmp_path / "splats.ply"), "--format", "splat"], capsys,
                   ["the splat export failed", "No space left on device", "free some space"])


def test_a_full_disk_while_checkpointing(tmp_path, capsys, monkeypatch, time_limit):
    from lift3d.checkpoints import AtomicCheckpointIO

    def full(self, checkpoint, path, storage_options=None):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", full)
    _fails_cleanly(["reconstruct", f"output_root={tmp_path}", "trainer.max_steps=1", "trainer.val_check_interval=0",
                    "trainer.enable_progress_bar=false", "trainer.run_test_after_fit=false", "system.export.formats=[]"],
                   capsys, ["the disk is full", "No space left on device", "output_root="])


@pytest.mark.parametrize(("flags", "expected"), [
    (["--width", "100000"], "--width must be 2..8192 pixels"),
    (["--height", "0"], "--height must be 2..8192 pixels"),
])
def test_render_sizes_out_of_range(flags, expected, run_folder, tmp_path, capsys, time_limit):
    (tmp_path / "path.json").write_text(json.dumps({"keyframes": [{"c2w": torch.eye(4).tolist()}]}))
    _fails_cleanly(["render", str(run_folder), "--path", str(tmp_path / "path.json"), *flags], capsys, expected)


@pytest.mark.parametrize("command", [["view", "model.ply", "--port", "99999"], ["app", "--port", "99999"],
                                     ["view", "model.ply", "--port", "-1"]])
def test_ports_out_of_range(command, capsys, time_limit):
    _fails_cleanly(command, capsys, "must be a TCP port 0..65535")


@pytest.mark.parametrize(("host", "expected"), [("192.0.2.1", "not an address of this machine"),
                                                ("nosuchhost.invalid", "the name does not resolve")])
def test_a_viewer_that_cannot_listen_fails_fast(host, expected, tmp_path, capsys, time_limit):
    """viser retries 1000 ports on a thread and its caller waits forever; lift3d checks the host first."""
    from lift3d.gaussians.formats.ply import save_ply
    from lift3d.gaussians.model import GaussianModel

    model = GaussianModel({"sh_degree": 0})
    model.initialize(torch.rand(20, 3), torch.rand(20, 3))
    save_ply(tmp_path / "splats.ply", model)
    _fails_cleanly(["view", str(tmp_path / "splats.ply"), "--host", host, "--port", "0"], capsys,
                   [f"the viewer cannot listen on {host}", "--host 127.0.0.1"])


@pytest.mark.parametrize("command", [["reconstruct"], ["poses"], ["view"], ["export"]])
def test_a_path_that_is_not_utf8(command, tmp_path, capsys, time_limit):
    name = os.fsdecode(bytes(tmp_path) + b"/sc\xffene")  # what Python hands over for a Latin-1 name on Linux
    _fails_cleanly([*command, name], capsys, ["is not valid UTF-8", "\\xff", "rename"])


def test_poses_frames_must_not_be_negative(tmp_path, capsys, time_limit):
    _fails_cleanly(["poses", str(tmp_path), "--frames", "-3"], capsys, "--frames must be a number of video frames >= 0")


@pytest.mark.parametrize("content", [b"text, not a video", os.urandom(4096)], ids=["text", "random-bytes"])
def test_unreadable_videos_print_no_ffmpeg_banner(content, tmp_path, capsys, time_limit):
    (tmp_path / "clip.mp4").write_bytes(content)
    err = _fails_cleanly(["poses", str(tmp_path / "clip.mp4")], capsys, "cannot read the video")
    assert "ffmpeg version" not in err and "configuration:" not in err and "libavcodec" not in err


@pytest.fixture
def unreachable_hub(monkeypatch, tmp_path):
    """No network: the hub's endpoint refuses connections at once, and the cache is empty."""
    from huggingface_hub import constants

    import lift3d.guidance.loading as loading

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(loading, "_hub_checks", {})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.mark.parametrize(("command", "twin"), [
    (["generate", "a cat"], "gaussian-sds-analytic"),
    (["generate", "--image", str(sample_scene_path() / "train" / "r_0.png")], "dreamgaussian-image-analytic"),
], ids=["text", "image"])
def test_generate_without_network_or_weights(command, twin, unreachable_hub, tmp_path, capsys, time_limit):
    err = _fails_cleanly([*command, f"output_root={tmp_path}", "trainer.max_steps=1", "trainer.enable_progress_bar=false"],
                         capsys,
                         ["cannot reach the Hugging Face hub to download", "system.guidance.pretrained_model_name_or_path=/path"])
    assert "scheduler_config.json" not in err and "Retry" not in err, err[-2000:]
    notices = [line for line in err.splitlines() if "needs a CUDA GPU" in line]
    if NO_CUDA:  # said up front, before the model loads, with the offline twin that runs on a CPU
        assert len(notices) == 1 and f"lift3d train {twin} " in notices[0], err[-2000:]
        assert err.index("needs a CUDA GPU") < err.index("lift3d: error:")
    else:
        assert not notices


def test_benchmarks_without_cuda_exit_at_once(monkeypatch, capsys, time_limit):
    from benchmarks.suite.step_floors import main as bench_main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA GPU here" in err[0] and "--tiny" in err[0]


def test_info_lists_every_export_format(capsys, time_limit):
    from lift3d.export.formats import export_table

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    section = out.split("writers", 1)[1].split("mesh tools:", 1)[0]
    listed = {line.split()[0] for line in section.splitlines()[1:] if line.strip()}
    assert listed == set(export_table()), listed
    assert {"splat", "spz", "gltf-splat", "mesh-ply"} <= listed


def test_library_warnings_are_one_line_or_quiet(capsys):
    """Deprecation notices from site-packages are dropped; a real warning is one ``lift3d: warning:`` line."""
    from lift3d.cli import show_warning

    site = "/usr/lib/python3/site-packages/somelib/module.py"
    show_warning(DeprecationWarning("old_arg is deprecated"), DeprecationWarning, site, 12)
    show_warning(UserWarning("The 'train_dataloader' does not have many workers"), UserWarning, site, 3)
    show_warning(UserWarning("the mesh has\n  no faces left"), UserWarning, site, 7)
    err = capsys.readouterr().err
    assert err == "lift3d: warning: the mesh has no faces left\n"
    show_warning(DeprecationWarning("old_arg is deprecated"), DeprecationWarning, site, 12, verbose=True)
    assert "old_arg is deprecated (DeprecationWarning at" in capsys.readouterr().err


def test_a_cpu_run_prints_no_device_lines_or_site_packages_paths(tmp_path):
    """What a user sees: no "GPU available: False / TPU available" lines, no warnings naming site-packages files."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "lift3d", "reconstruct", f"output_root={tmp_path}", "trainer.max_steps=2",
                           "trainer.val_check_interval=0", "trainer.run_test_after_fit=false", "system.export.formats=[]",
                           "trainer.enable_progress_bar=false"], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for noise in ("GPU available", "TPU available", "site-packages", "was configured so", "Traceback"):
        assert noise not in done.stderr, done.stderr[-3000:]
    assert "lift3d: results in" in done.stdout


def test_a_closed_output_pipe_is_not_an_error():
    """``lift3d info | head -1``: the reader leaves early; lift3d stops quietly with exit 0."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "lift3d", "info"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"lift3d")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "internal error" not in err and "Traceback" not in err, err
