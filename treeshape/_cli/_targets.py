"""`treeshape targets`: the accelerators that `cost` and `fit` compile for with `--target NAME`."""

from typing import TextIO


def run(stdout: TextIO) -> int:
    from .._cost import targets

    listed = targets()
    width = max(len(name) for name in listed)
    for name, description in listed.items():
        print(f"{name:<{width}}  {description}", file=stdout)
    return 0
