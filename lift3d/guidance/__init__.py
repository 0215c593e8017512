"""Diffusion guidance: the 2D priors text-to-3D distils from (SDS, VSD, the analytic prior).

Importing the package registers ``stable-diffusion``, ``stable-diffusion-vsd``, ``zero123``, ``mvdream``, ``deepfloyd-if``,
``analytic`` and ``analytic-multiview``.
"""

from lift3d.guidance import analytic, analytic_multiview, deepfloyd_if, mvdream, sds, vsd, zero123  # noqa: F401  (register the parts)
