"""Diffusion guidance: the 2D priors text-to-3D distils from (SDS, VSD, the analytic prior).

Importing the package registers ``stable-diffusion``, ``stable-diffusion-vsd`` and ``analytic``.
"""

from lift3d.guidance import analytic, sds, vsd  # noqa: F401  (register the parts)
