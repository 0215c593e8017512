"""The volume renderer of NeRF fields: occupancy grid, marching, proposal sampling, compositing, its regularizers."""
