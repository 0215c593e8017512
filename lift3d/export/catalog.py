"""The export formats lift3d writes, by name: what each needs from a run and what it is. ``export.formats`` takes
these names (``config``) and the exporters write them (``formats``); a new format is one row here."""

from __future__ import annotations

# format name -> (what it needs, what it is)
FORMATS: dict[str, tuple[str, str]] = {
    "glb": ("mesh", "binary glTF mesh, albedo texture embedded (vertex colors when texture_size=0)"),
    "obj": ("mesh", "Wavefront .obj + .mtl + texture .png"),
    "mesh-ply": ("mesh", ".ply mesh with vertex colors"),
    "3dgs-ply": ("write_3dgs_ply", "3D Gaussians in the 3DGS .ply layout"),
    "splat": ("gaussians", "3D Gaussians in the compact .splat layout"),
    "html": ("gaussians", "one self-contained web page showing the Gaussians (WebGL, orbit controls, works offline)"),
    "spz": ("gaussian_params", "3D Gaussians in Niantic's compressed .spz (SH bands kept)"),
    "sog": ("gaussian_params", "3D Gaussians in PlayCanvas's .sog bundle (WebP-quantized, SH palette)"),
    "gltf-splat": ("gaussian_params", "3D Gaussians in glTF (-gaussians.glb) with KHR_gaussian_splatting"),
    "ksplat": ("gaussian_params", "3D Gaussians in GaussianSplats3D's .ksplat (16-bit, SH bands up to 2)"),
    "sog-lod": ("gaussian_params", "levels of detail as PlayCanvas's streamed SOG (-lod/lod-meta.json, a SOG per level)"),
    "mp4": ("render_fn", "turntable video (H.264)"),
    "gif": ("render_fn", "turntable animation"),
}
