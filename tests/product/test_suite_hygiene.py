"""The suite leaves the user's checkout as it found it: a run that names no output_root, started from the checkout (as
the CLI error cases do), writes its run_dir under a temp folder, not ``outputs/`` in the clone (tests/conftest.py)."""

from __future__ import annotations

from lift3d.cli import main
from tests.conftest import REPO, TEST_CONFIGS


def test_a_run_with_the_default_output_root_writes_outside_the_checkout(_session_outputs, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    args = ["train", str(TEST_CONFIGS / "fit-image.yaml"), "tag=hygiene", "trainer.max_steps=2", "trainer.val_check_interval=0",
            "trainer.run_test_after_fit=false", "trainer.enable_progress_bar=false"]
    assert main(args) == 0, capsys.readouterr().err[-2000:]
    runs = list((_session_outputs / "outputs" / "fit-image").glob("hygiene*"))
    assert len(runs) == 1 and (runs[0] / "configs" / "parsed.yaml").is_file()
    assert not runs[0].resolve().is_relative_to(REPO)
