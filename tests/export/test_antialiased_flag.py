"""A run trained with the antialiased rasterization mode says so in the .spz it exports (the header's flag), so viewers
that honor it render the Gaussians with the same 2D filter; a classic run's file does not carry the flag."""

import pytest

from lift3d.cli import main
from lift3d.gaussians.formats.spz import spz_info


@pytest.mark.parametrize("mode", ["antialiased", "classic"])
def test_a_runs_spz_carries_its_rasterization_mode(tmp_path, mode):
    assert main(["reconstruct", f"output_root={tmp_path}", "trainer.max_steps=2", "trainer.val_check_interval=0",
                 "trainer.run_test_after_fit=false", "system.export.formats=[spz]", "use_timestamp=false",
                 "trainer.enable_progress_bar=false", f"system.renderer.rasterize_mode={mode}"]) == 0
    (spz,) = sorted((tmp_path / "reconstruct-gaussians-sample" / "sample_scene" / "save").glob("*.spz"))
    assert spz_info(spz).antialiased is (mode == "antialiased")
