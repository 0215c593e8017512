"""Stand-ins for what a benchmark cannot download or wait for: models of the released architectures with random
weights (the same compute as the real ones), written as folders the recipes load or built in memory, and a converged
field to time a late training stage from."""
