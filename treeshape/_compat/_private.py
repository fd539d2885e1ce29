"""The one module of treeshape that imports `jax._src`: JAX's private modules that the
wing's rooms need where no public API gives the same (each room says why, where it uses
one). The rooms import them from here, never from `jax._src` (`tests/test_compat.py`
checks this). Those only a compile by hand needs (`mlir`, `compiler`, `lib`) are imported
at their first use.
"""

from types import ModuleType

from jax._src import (
    config as config,
    core as core,
    dtypes as dtypes,
    mesh as mesh,
    util as util,
    xla_bridge as xla_bridge,
)
from jax._src.export import shape_poly as shape_poly
from jax._src.lax import lax as lax


def mlir() -> ModuleType:
    """`jax._src.interpreters.mlir`: MLIR contexts, StableHLO bytecode."""
    from jax._src.interpreters import mlir

    return mlir


def compiler() -> ModuleType:
    """`jax._src.compiler`: compile options and a compile as `jax.jit` runs it."""
    from jax._src import compiler

    return compiler


def lib() -> ModuleType:
    """`jax._src.lib`: jaxlib's XLA client."""
    from jax._src import lib

    return lib
