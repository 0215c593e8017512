"""lift3d's benchmarks, run from the repository root as ``python -m benchmarks NAME [args]`` (``--list`` names them).

- ``suite/``: the benchmarks, one module each, named by what it measures; each prints one JSON line per case.
- ``reference/``: the plain training loops the recipes are compared against.
- ``stand_ins/``: random-weight models of the released architectures, and a converged field to start from.
- ``timing.py`` (the one clock: sync, timed calls, stopwatches, peak memory), ``records.py`` (JSON lines and the
  environment of a record), ``profiling.py`` (where a step's time goes), ``floor.py`` and ``step_cases.py`` (the
  arithmetic floors and cases of ``step_floors``).

The current figure of each benchmark, with its date, machine and command, is in ``benchmarks/RESULTS.md``.
"""
