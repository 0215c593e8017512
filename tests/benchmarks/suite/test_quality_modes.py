"""The quality_modes benchmark: every variant's overrides make a valid reconstruct-gaussians config whose parts
build (so the GPU benchmark that picks the defaults cannot rot on a renamed key)."""

from __future__ import annotations

from benchmarks.suite import quality_modes as bench


def test_every_variant_builds(tmp_path):
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.registry import find

    assert set(bench.VARIANTS) == {"default", "mcmc", "antialiased", "absgrad"}
    for name, overrides in bench.VARIANTS.items():
        extra = ["system.densify.max_gaussians=5000"] if name == "mcmc" else []
        cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=[f"output_root={tmp_path}", *overrides, *extra])
        system = find(cfg.system_type)(cfg.system)
        if name == "mcmc":
            assert type(system.densify).__name__ == "MCMCStrategy" and system.densify.cfg.max_gaussians == 5000
            assert system.densify.cfg.refine_stop == 25000  # the 3DGS schedule's options were dropped with its type
        if name == "antialiased":
            assert system.renderer.cfg.rasterize_mode == "antialiased"
        if name == "absgrad":
            assert system.densify.cfg.absgrad and system.renderer.cfg.absgrad  # the system turns the renderer's on
        if name == "default":
            assert system.renderer.cfg.rasterize_mode == "classic" and not system.renderer.cfg.absgrad


def test_capture_records_count_the_gaussians(tmp_path):
    from benchmarks.suite import capture as module

    (tmp_path / "scene").mkdir()
    (tmp_path / "scene" / "point_cloud.ply").write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 1234\n"
                                                         b"property float x\nend_header\n" + bytes(16))
    assert module.gaussian_count(tmp_path) == 1234
    assert module.gaussian_count(tmp_path / "scene" / "none") is None
