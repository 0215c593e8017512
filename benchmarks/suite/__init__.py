"""The benchmarks, one module each, named by what it measures; ``python -m benchmarks NAME [args]`` runs one
(``python -m benchmarks --list``: every name with what it measures). Each has ``main(argv) -> int`` and prints one
JSON line per case."""
