"""Mesh stages of text-to-3D: a triangle mesh (DMTet, or a user's mesh) rendered by the mesh rasterizer
and distilled from a 2D prior.

One system, ``mesh-stage``, serves the recipes (configs):

* ``magic3d-refine``: DMTet + texture field, SDS on shaded 512x512 renders, started from a
  ``dreamfusion`` run (``system.geometry_convert_from``);
* ``prolificdreamer-geometry``: DMTet from a ``prolificdreamer`` NeRF run, SDS on normal maps
  (``guidance_input: normal``), normal-consistency and Laplacian regularizers;
* ``prolificdreamer-texture``: the geometry stage's mesh frozen (``geometry.fix_geometry``), its texture
  field distilled by VSD;
* ``texture-mesh``: a user's .obj/.glb (``custom-mesh`` geometry) textured against a prompt;
* ``gaussian-sds-texture``: a ``gaussian-sds`` run's Gaussians meshed at their density level (as their
  export does), the mesh frozen, the texture field started from their colors and refined by SDS
  (DreamGaussian's second stage).

Converting from a density stage (a NeRF, or Gaussians: any run with ``density_at`` / ``albedo_at``)
sets the DMTet SDF from the previous density at the isosurface threshold (``isosurface_threshold``;
unset: the previous run's ``export.threshold``; unset too: chosen automatically as the exporter does,
on voxel opacities for the previous run's ``density_opacity_scale``), optionally with enclosed pockets
filled and floaters dropped on the grid, and, with ``inherit_texture``, regresses the texture field
onto the previous albedo at the new surface. Converting from a mesh stage copies its geometry.
Each stage exports its mesh with a baked texture (``export.formats: [glb]``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.config import bounded, choice, scheduled
from lift3d.export import ExportSources
from lift3d.export.grid import auto_threshold
from lift3d.export.mesh import fill_cavities, keep_largest_regions
from lift3d.meshes.mesh import Mesh
from lift3d.meshes.regularizers import laplacian_smoothing, normal_consistency
from lift3d.meshes.texture_field import fit_texture, sample_surface
from lift3d.meshes.topology import EdgeTopology, edge_topology
from lift3d.registry import register
from lift3d.systems.stages import copy_matching_parts
from lift3d.systems.text_to_3d import TextTo3DConfig, TextTo3DLoss, TextTo3DSystem

log = logging.getLogger(__name__)


@dataclass
class MeshStageLoss(TextTo3DLoss):
    lambda_normal_consistency: Any = scheduled(0.0, low=0)  # 1 - cos between normals of adjacent faces (smooth surfaces)
    lambda_laplacian_smoothness: Any = scheduled(0.0, low=0)  # squared uniform Laplacian of the vertices (even triangles)
    lambda_sdf_flip: Any = scheduled(0.0, low=0)  # DMTet: sign agreement across the surface's grid edges (fewer floaters)


@dataclass
class MeshStageConfig(TextTo3DConfig):
    geometry_type: str = "dmtet"  # registered mesh geometry: dmtet or custom-mesh
    geometry: dict = dataclasses.field(default_factory=lambda: {"texture_type": "hash-grid-texture"})  # its config
    material_type: str = "diffuse"  # registered material (features from the texture field -> color)
    material: dict = dataclasses.field(default_factory=dict)  # its config
    background_type: str = "neural-environment"  # registered background (color per view direction)
    background: dict = dataclasses.field(default_factory=dict)  # its config
    renderer_type: str = "mesh-rasterizer"  # registered mesh renderer
    renderer: dict = dataclasses.field(default_factory=dict)  # its config
    # what the guidance sees: rgb (shaded render) or normal (world normals as (n + 1) / 2)
    guidance_input: str = choice("rgb", "normal")
    normal_background: list = bounded([0.0, 0.0, 0.0], low=0, high=1, lengths=(3,))  # RGB behind normal maps
    # NeRF -> DMTet: density level of the surface (None: the previous export.threshold, else automatic)
    isosurface_threshold: float | None = None
    isosurface_fill_holes: bool = False  # NeRF -> DMTet: fill enclosed empty pockets first (one outer surface for shells)
    # NeRF -> DMTet: keep only the k largest solid regions of the grid (0: all; 1 drops floaters)
    isosurface_keep_components: int = bounded(0, low=0)
    # fit the texture field to the previous stage's albedo (NeRF), copy it (mesh), or to a user mesh file's texture
    inherit_texture: bool = True
    inherit_texture_steps: int = bounded(500, low=0)  # Adam steps of that fit
    inherit_texture_points: int = bounded(262144, low=1)  # surface points it fits on
    loss: MeshStageLoss = dataclasses.field(default_factory=MeshStageLoss)  # loss weights


def normal_image(normal: Tensor, alpha: Tensor, background: Tensor) -> Tensor:
    """Normal map [B, H, W, 3] in 0..1 from alpha-weighted world normals [B, H, W, 3] and ``alpha``
    [B, H, W, 1], over ``background`` [3]: ``(n + 1) / 2`` where covered."""
    return 0.5 * (normal + alpha) + (1.0 - alpha) * background.to(normal)


@register("mesh-stage")
class MeshStageSystem(TextTo3DSystem):
    """A mesh distilled from a 2D prior (Magic3D refine, ProlificDreamer geometry / texture, texturing a mesh)."""

    Config = MeshStageConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        self.geometry = self.build_part(c.geometry_type, c.geometry)
        self.material = self.build_part(c.material_type, c.material)
        self.background = self.build_part(c.background_type, c.background)
        self.renderer = self.build_part(c.renderer_type, c.renderer)
        self.register_buffer("normal_bg", torch.tensor([float(v) for v in c.normal_background]), persistent=False)

    # ------------------------------------------------------------------------------ surface queries
    @property
    def geometry_fixed(self) -> bool:
        return bool(getattr(self.geometry, "fixed_geometry", False) or getattr(self.geometry.cfg, "fix_geometry", False))

    def features_at(self, points: Tensor) -> Tensor:
        """Texture features [N, C] at surface points [N, 3]."""
        return self.geometry.color(points)

    @torch.no_grad()
    def albedo_at(self, points: Tensor) -> Tensor:
        """View- and light-independent color [N, 3] at points [N, 3] (baked into exported textures)."""
        chunk = 262144
        if not len(points):
            return points.new_zeros(0, 3)
        return torch.cat([self.material.albedo(self.features_at(p)) for p in points.split(chunk)])

    # ------------------------------------------------------------------------------ stages
    def convert_from(self, previous: Any, previous_cfg: Any) -> None:
        """Start from a NeRF run (mesh its density, inherit its albedo) or a mesh run (copy its geometry).

        Runs on the trainer's device (Lightning calls ``setup`` before it moves the system there): the
        density queries on the grid and the texture fit are GPU work."""
        previous.to(self._work_device())
        try:
            with self._surface_on_work_device():
                if hasattr(previous, "density_at"):
                    self._convert_from_density(previous, previous_cfg)
                elif isinstance(getattr(previous, "geometry", None), nn.Module):
                    self._convert_from_mesh(previous, previous_cfg)
                else:
                    raise ValueError(
                        f"system.geometry_convert_from: a {previous_cfg.system_type} run cannot start a mesh stage: it "
                        "needs a density field to mesh (a dreamfusion, prolificdreamer or gaussian-sds run: density_at / "
                        "albedo_at) or a mesh-stage run to copy; point system.geometry_convert_from at one of those"
                    )
        finally:
            previous.to("cpu")
        copy_matching_parts(self, previous, ("material", "background"), same_type=True)
        self.reset_mesh_cache()

    def _work_device(self) -> torch.device:
        """Where setup-time work runs: the trainer's device (Lightning calls ``setup`` before moving the system)."""
        return self.trainer.strategy.root_device if self._trainer is not None else self.device

    @contextlib.contextmanager
    def _surface_on_work_device(self) -> Iterator[torch.device]:
        """Geometry and material on the work device for the duration (grid queries and texture fits are GPU work)."""
        home, work = self.device, self._work_device()
        self.geometry.to(work)
        self.material.to(work)
        try:
            yield work
        finally:
            self.geometry.to(home)
            self.material.to(home)

    def _convert_from_density(self, previous: Any, previous_cfg: Any) -> None:
        geometry = self.geometry
        if not hasattr(geometry, "initialize_from_grid_density"):
            raise ValueError(
                f"system.geometry_convert_from: a {previous_cfg.system_type} run is a density field, which only a "
                f"dmtet geometry can start from (this run's geometry_type is {self.cfg.geometry_type})"
            )
        device = geometry.grid_vertices.device
        density = geometry.sample_grid(previous.density_at)
        threshold, source = self.cfg.isosurface_threshold, "given"
        if threshold is None:
            threshold = getattr(getattr(previous.cfg, "export", None), "threshold", None)
            source = "the previous run's export.threshold"
        if threshold is None:
            # voxel opacity 1 - exp(-density * scale): a NeRF's density is per unit length (scale: the cell size)
            scale = getattr(previous, "density_opacity_scale", None) or geometry.cell_size
            threshold, source = auto_threshold(density.cpu().numpy(), scale), "chosen automatically"
        log.info("meshing the previous density at %.4g (%s)", threshold, source)
        geometry.initialize_from_grid_density(self._clean_level_set(density, float(threshold)), float(threshold))
        if self.cfg.inherit_texture and hasattr(previous, "albedo_at"):
            self._inherit_albedo(previous.albedo_at, device)

    def setup(self, stage: str) -> None:
        """A user's textured mesh (texture-mesh) starts its texture field from the file's texture (inherit_texture)."""
        super().setup(stage)
        resuming = self._trainer is not None and self.trainer.ckpt_path is not None
        if stage != "fit" or resuming or self.cfg.geometry_convert_from or not self.cfg.inherit_texture:
            return
        has_samples = hasattr(self.geometry, "texture_samples")
        samples = self.geometry.texture_samples(self.cfg.inherit_texture_points) if has_samples else None
        if samples is None:
            return
        with self._surface_on_work_device() as work:
            self._fit_albedo(*(t.to(work) for t in samples), "the mesh file's texture")
        self.reset_mesh_cache()

    def _clean_level_set(self, density: Tensor, threshold: float) -> Tensor:
        """The grid density [V] with enclosed pockets filled and only the largest solid regions kept, as configured."""
        fill, keep = self.cfg.isosurface_fill_holes, self.cfg.isosurface_keep_components
        if not fill and keep <= 0:
            return density
        volume = density.view(self.geometry.grid_shape).cpu().numpy()
        if fill:
            volume = fill_cavities(volume, threshold)
        volume = keep_largest_regions(volume, threshold, keep)
        return torch.from_numpy(volume).reshape(-1).to(density)

    @torch.no_grad()
    def _inherit_albedo(self, albedo_fn: Any, device: torch.device) -> None:
        """Fit the texture field to ``albedo_fn`` at points on the (new) surface."""
        mesh = self.geometry()
        points = sample_surface(mesh.vertices, mesh.faces, self.cfg.inherit_texture_points, seed=0)
        targets = torch.cat([albedo_fn(p.to(device)).to(points) for p in points.split(262144)])
        self._fit_albedo(points, targets, "the previous albedo")

    def _fit_albedo(self, points: Tensor, targets: Tensor, source: str) -> None:
        """Regress the texture field's albedo onto ``targets`` [N, 3] at surface ``points`` [N, 3]."""
        params = [p for p in self.geometry.texture.parameters() if p.requires_grad]
        loss = fit_texture(lambda p: self.material.albedo(self.features_at(p)), params, points, targets,
                           steps=self.cfg.inherit_texture_steps)
        log.info("texture field fitted to %s: mse %.4g after %d steps", source, loss, self.cfg.inherit_texture_steps)

    def _convert_from_mesh(self, previous: Any, previous_cfg: Any) -> None:
        skip = () if self.cfg.inherit_texture else ("texture.",)
        source, target = previous.geometry.state_dict(), self.geometry.state_dict()
        taken = {k: v for k, v in source.items() if k in target and v.shape == target[k].shape and not k.startswith(skip)}
        geometry_keys = {k for k in target if not k.startswith("texture.")}
        if not geometry_keys <= taken.keys():
            raise ValueError(
                f"system.geometry_convert_from: the {previous_cfg.system_type} run's geometry does not match this one "
                f"(missing or reshaped: {sorted(geometry_keys - taken.keys())}); keep geometry_type and grid_resolution"
            )
        self.geometry.load_state_dict(taken, strict=False)
        self.reset_mesh_cache()
        with_texture = any(k.startswith("texture.") for k in taken)
        log.info("took the geometry%s from the previous stage", " and texture" if with_texture else "")

    def reset_mesh_cache(self) -> None:
        """Forget a frozen geometry's cached mesh (after its parameters were overwritten)."""
        if hasattr(self.geometry, "_cached"):
            self.geometry._cached = None

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.reset_mesh_cache()

    # ------------------------------------------------------------------------------ rendering
    def _background(self, batch: dict[str, Any]) -> Tensor:
        """Background [B, H, W, 3] (or [B, 3]) for the batch's views."""
        if batch.get("background") is not None:
            return batch["background"]
        _, dirs = batch["cameras"].to(self.device).rays()
        return self.background(dirs)

    def render_mesh(self, mesh: Mesh, batch: dict[str, Any], topology: EdgeTopology | None = None,
                    color: bool = True) -> dict[str, Tensor]:
        """The mesh renderer's outputs for the batch's cameras (``color=False``: no texture queries)."""
        lights = batch.get("light_positions")

        def color_fn(surface: dict[str, Tensor]) -> Tensor:
            points = surface["points"]
            light = None if lights is None else lights.to(points)[surface["batch_index"]]
            return self.material(self.features_at(points), surface["view_dirs"], normals=surface["normals"],
                                 positions=points, light_positions=light)

        background = self._background(batch) if color else torch.zeros(3, device=self.device)
        # rasterize in float32 under mixed precision too: clip coordinates and z-buffer depths need the bits
        with torch.autocast(self.device.type, enabled=False):
            mesh = Mesh(mesh.vertices.float(), mesh.faces)
            return self.renderer(mesh, batch["cameras"], background=background.float(), color_fn=color_fn if color else None,
                                 topology=topology)

    def render(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        out = self.render_mesh(self.geometry(), batch)
        return {k: out[k] for k in ("rgb", "alpha", "depth", "normal")}

    # ------------------------------------------------------------------------------ training
    def regularizers(self, mesh: Mesh, topology: EdgeTopology) -> dict[str, Tensor]:
        """The shape regularizers with a non-zero weight at this step (none for a fixed shape)."""
        terms: dict[str, Tensor] = {}
        if self.geometry_fixed:
            return terms
        if self.loss_weight("normal_consistency") != 0:
            terms["normal_consistency"] = normal_consistency(mesh.vertices, mesh.faces, topology)
        if self.loss_weight("laplacian_smoothness") != 0:
            terms["laplacian_smoothness"] = laplacian_smoothing(mesh.vertices, mesh.faces, topology)
        if self.loss_weight("sdf_flip") != 0 and hasattr(self.geometry, "sdf_regularizer"):
            terms["sdf_flip"] = self.geometry.sdf_regularizer()
        return terms

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        mesh = self.geometry()
        topology = edge_topology(mesh.faces)  # once per step: the antialias pass and the regularizers share it
        normals_only = self.cfg.guidance_input == "normal"
        out = self.render_mesh(mesh, batch, topology, color=not normals_only)
        image = normal_image(out["normal"], out["alpha"], self.normal_bg) if normals_only else out["rgb"]
        terms = self.distill(image, batch)
        terms.update(self.regularizers(mesh, topology))
        self.log_step("train/faces", float(mesh.num_faces))
        return self.total_loss(terms)

    # ------------------------------------------------------------------------------ export
    @torch.no_grad()
    def export_mesh(self) -> Mesh:
        """The current mesh with vertex albedo, as the exporters take it (numpy arrays)."""
        mesh = self.geometry()
        vertices, faces, normals = mesh.vertices.detach(), mesh.faces, mesh.vertex_normals().detach()
        layout = self.geometry.uv_layout() if hasattr(self.geometry, "uv_layout") else None
        uv = None
        if layout is not None:  # a user's mesh with UVs: split at its seams, the texture is baked into its UVs
            index, uv, faces = layout
            vertices, normals = vertices[index], normals[index]
        colors = self.albedo_at(vertices).float().clamp(0, 1)
        return Mesh(vertices, faces, vertex_colors=colors, normals=normals, uv=uv).numpy()

    def export_sources(self) -> ExportSources:
        frame = getattr(self.geometry, "file_frame", None)  # a user's mesh: exported where it was
        return ExportSources(
            mesh=self.export_mesh,
            color_fn=self.albedo_at,
            render_fn=lambda cameras: self.render({"cameras": cameras}),
            device=self.device,
            file_frame=frame,
            # a surface this run made (not a user's mesh, whose topology is theirs) goes to export.target_faces
            mesh_to_budget=frame is None,
        )
