"""The mesh renderer: differentiable triangle rasterization with analytic silhouette antialiasing."""
