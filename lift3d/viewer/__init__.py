"""The live 3D viewer (viser): ``lift3d view`` on a finished run or file, ``--viewer`` while training, and camera
paths recorded on its page rendered by ``lift3d render``. viser is an optional extra (``pip install 'lift3d[viewer]'``),
imported only when a viewer starts."""
