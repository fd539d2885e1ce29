"""Speed and memory benchmarks for treeshape (issues 2 speed, 3 loop carries, 5 cache memory, 9 scale).

Run `python benchmarks/run.py` for the full benchmark, `--quick` for the CI
smoke run (few repetitions, smaller trees; goals are printed but never fail
the run), `--only NAME` for some cases (or the group `scale`), `--json PATH`
to save the results, `--check` to exit 1 when a goal is missed, `--profile`
for the costliest functions under cProfile.

This file is the entry point only: the harness (goals, rows, interleaved
timing, the registry, the report) is `harness.py`, the shared workloads are
`workloads.py`, and each case is a module of `cases/`, whose docstring says
what it measures and why its baseline is fair. Run it as a script (its
directory is then on `sys.path`, so `harness`, `workloads` and `cases` import
without installing anything); the subprocess probes of the memory cases run
it again with a hidden `--probe NAME ARG`.
"""

import sys

import cases  # noqa: F401  (registers every case and probe)
import harness


if __name__ == "__main__":
    sys.exit(harness.main(description=__doc__.splitlines()[0] if __doc__ else None))
