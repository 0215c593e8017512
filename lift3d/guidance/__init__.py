"""Diffusion guidance: the 2D priors text-to-3D distils from (SDS, VSD, the analytic prior).

Importing the package registers ``stable-diffusion``, ``stable-diffusion-vsd``, ``zero123``, ``analytic`` and ``deepfloyd-if``.
"""

import lift3d.guidance.deepfloyd_if  # noqa: F401  (registers deepfloyd-if)
from lift3d.guidance import analytic, sds, vsd, zero123  # noqa: F401  (register the parts)
