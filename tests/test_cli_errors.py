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
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from lift3d.cli import main
from lift3d.data.sample_scene import sample_scene_path
from lift3d.recipes import recipe_config

RECIPE = str(recipe_config("reconstruct-gaussians-sample"))


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A finished two-step sample reconstruction (its folder, config and checkpoint)."""
    root = tmp_path_factory.mktemp("audit")
    assert main(["reconstruct", f"output_root={root}", "trainer.max_steps=2", "trainer.val_check_interval=0",
                 "trainer.run_test_after_fit=false", "system.export.formats=[]", "use_timestamp=false",
                 "trainer.enable_progress_bar=false"]) == 0
    return root / "reconstruct-gaussians-sample" / "sample_scene"


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
    from lift3d.gaussians.model import GaussianModel
    from lift3d.gaussians.ply import save_ply

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
        (["generate", "--image", str(sample_scene_path() / "train" / "r_0.png"), "--method", "dreamfusion"], "makes 3D from text"),
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
          "system.field.contraction=ball"], "implicit-volume: field contraction must be one of none, cube, sphere"),
        (["train", "configs/reconstruct-nerf-unbounded-cpu.yaml", f"data.root={sample_scene_path()}", f"output_root={tmp}",
          "system.renderer.disparity_from=0"], "needs renderer.disparity_from > 0"),
        (["train", "configs/mvdream-analytic.yaml", f"output_root={tmp}"], "random-views: data.reference_eval_split needs data.reference_scene"),
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
