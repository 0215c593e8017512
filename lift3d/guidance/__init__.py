"""Diffusion guidance: the 2D priors text-to-3D distils from (SDS, VSD, the analytic prior).

Importing the package registers ``stable-diffusion``, ``stable-diffusion-vsd``, ``zero123`` and ``analytic``, and the
editors ``instruct-pix2pix`` and ``analytic-edit``.
"""

from lift3d.guidance import analytic, editing, instruct_pix2pix, sds, vsd, zero123  # noqa: F401  (register the parts)
