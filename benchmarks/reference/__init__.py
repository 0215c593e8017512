"""The plain loops benchmarks compare the recipes against: the same model, data and loss trained by a bare ``for``
loop (no Lightning, no CUDA graph), so a difference is the training loop's."""
