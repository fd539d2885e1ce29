"""treeshape: pytree shape inference safe under every JAX transformation."""

import importlib.metadata

from ._carry import (
    carry_structure as carry_structure,
    fori_carry as fori_carry,
    scan_carry as scan_carry,
    while_carry as while_carry,
)
from ._display import describe as describe
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
from ._weak import (
    is_weak as is_weak,
    strip_weak_type as strip_weak_type,
    upcast as upcast,
    weak_paths as weak_paths,
)


__all__ = [
    "CarryMismatchError",
    "Mismatch",
    "Structure",
    "StructureMismatchError",
    "cache_info",
    "carry_structure",
    "clear_cache",
    "describe",
    "fori_carry",
    "is_weak",
    "out_structure",
    "scan_carry",
    "strip_weak_type",
    "structure_of",
    "upcast",
    "weak_paths",
    "while_carry",
]
__version__ = importlib.metadata.version("treeshape")
