"""A finished run of the built-in sample reconstruction, as tests that read run folders need one."""

from __future__ import annotations

from pathlib import Path

from lift3d.cli import main


def finished_sample_run(root: Path) -> Path:
    """A two-step ``lift3d reconstruct`` of the sample scene under ``root`` (no exports); its run folder."""
    assert main(["reconstruct", f"output_root={root}", "trainer.max_steps=2", "trainer.val_check_interval=0",
                 "trainer.run_test_after_fit=false", "system.export.formats=[]", "use_timestamp=false",
                 "trainer.enable_progress_bar=false"]) == 0
    return root / "reconstruct-gaussians-sample" / "sample_scene"
