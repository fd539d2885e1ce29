"""treeshape: pytree shape inference safe under every JAX transformation."""

import importlib.metadata

from ._errors import (
    CarryMismatchError as CarryMismatchError,
    StructureMismatchError as StructureMismatchError,
)
from ._infer import (
    cache_info as cache_info,
    clear_cache as clear_cache,
    out_structure as out_structure,
    structure_of as structure_of,
)
from ._structure import Mismatch as Mismatch, Structure as Structure


__all__ = [
    "CarryMismatchError",
    "Mismatch",
    "Structure",
    "StructureMismatchError",
    "cache_info",
    "clear_cache",
    "out_structure",
    "structure_of",
]
__version__ = importlib.metadata.version("treeshape")
