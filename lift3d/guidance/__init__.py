"""Diffusion guidance: the 2D priors text-to-3D distils from (SDS, VSD, the analytic prior).

Importing the package registers ``stable-diffusion``, ``stable-diffusion-vsd``, ``zero123``, ``mvdream``, ``deepfloyd-if``,
``analytic`` and ``analytic-multiview``, and the editors ``instruct-pix2pix`` and ``analytic-edit``.
"""

from lift3d.guidance import (  # noqa: F401  (register the parts)
    analytic,
    analytic_multiview,
    deepfloyd_if,
    editing,
    instruct_pix2pix,
    mvdream,
    sds,
    vsd,
    zero123,
)
