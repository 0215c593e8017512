"""Every Gaussian file codec, one module a format: 3DGS ``ply``, ``splat``, ``spz``, ``sog`` (and ``sog_lod``, its
levels of detail), ``ksplat`` and glTF (``gltf``). Each writes with ``save_*`` and reads with ``load_*`` (pre-activation
parameters in lift3d's world), most of them over ``encode_*`` / ``decode_*`` on bytes; ``codec`` holds what they share
and ``files`` picks the reader by suffix."""
