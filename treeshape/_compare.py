"""When two Structures are the same: `Structure.diff`'s `ignore` kinds, and `==`, `hash`
and pickling, which agree with `diff`: the treedef, static leaves as `diff` compares
them, and each array leaf's shape, dtype, weak type and manual axes, never its sharding.

It works on what a Structure shows and does not import `_structure`, whose methods
call it.
"""

import io
import pickle
import sys
import types
from collections.abc import Collection, Sequence
from typing import Any, Final, Literal, get_args

import jax
import jax.tree_util as jtu

from . import _dims
from ._diff import diff_structures, static_equal
from ._errors import Mismatch, is_static
from ._leaf import manual_axis_sets, same_type, static_value
from ._nodes import by_text
from ._shapes import shape_key
from ._tree import StaticRepr, as_text
from ._views import StructureView


# The mismatch kinds `diff`, `check` and `matches` may leave out (`ignore=`).
Ignorable = Literal["weak_type", "vma", "sharding", "dtype", "shape", "static"]
IGNORABLE: Final[tuple[Ignorable, ...]] = get_args(Ignorable)


def ignored(ignore: Ignorable | Collection[Ignorable], fn_name: str) -> frozenset[str]:
    """The mismatch kinds `ignore` names, checked (for `Structure.{fn_name}`)."""
    kinds = frozenset((ignore,) if isinstance(ignore, str) else ignore)
    unknown = kinds - set(IGNORABLE)
    if unknown:
        allowed = ", ".join(repr(k) for k in IGNORABLE)
        raise ValueError(
            f"treeshape.Structure.{fn_name}: `ignore` takes mismatch kinds among {allowed}; got "
            f"{', '.join(repr(k) for k in sorted(unknown, key=repr))}. (Tree structure differences are never ignored.)"
        )
    return kinds


def diff(expected: StructureView, actual: StructureView, kinds: frozenset[str]) -> list[Mismatch]:
    """Every difference of `actual` from `expected` but those of the `kinds` left out."""
    if expected.dims:
        found = _dims.match(expected, actual, "tree")[1]
    else:  # an orbax checkpoint's metadata tree is read as the tree it was written from
        saved = 1 if _orbax(expected) else 2 if _orbax(actual) else 0
        found = diff_structures(expected, actual, "tree", saved=saved)
    if "static" in kinds:  # static leaves and fields differ as "structure": told apart by their values
        found = [m for m in found if not is_static(m)]
    return [m for m in found if m.kind not in kinds] if kinds else found


def _orbax(s: StructureView) -> bool:
    """Whether `s` was read from an orbax checkpoint's metadata tree (`_leaf.written_by_orbax`)."""
    return s._memo("orbax", lambda: False)


def equal(a: StructureView, b: StructureView) -> bool:
    """`a == b` for two Structures with as many leaves: the treedefs, then leaf by leaf."""
    try:
        same_treedef = bool(a.treedef == b.treedef)
    except Exception:  # node data JAX cannot compare (e.g. an array): as `diff` compares it
        return not diff_structures(a, b, "tree")
    return same_treedef and all(map(_same_leaf, a.leaves, b.leaves))


def _same_leaf(e: Any, a: Any) -> bool:
    """Leaf equality for `==`: array leaves by shape, dtype, weak type and manual
    axes (not sharding), static leaves as `diff` compares them."""
    if e is a:
        return True
    sds = jax.ShapeDtypeStruct
    if isinstance(e, sds):
        return isinstance(a, sds) and same_type(e, a)
    return not isinstance(a, sds) and static_equal(e, a)


def hash_of(treedef: jtu.PyTreeDef, leaves: Sequence[Any]) -> int:
    """A hash that agrees with `equal`."""
    try:
        treedef_hash = hash(treedef)
    except Exception:  # node data that cannot be hashed: the shape of the tree
        treedef_hash = hash((treedef.num_nodes, treedef.num_leaves))
    return hash((treedef_hash, tuple(map(_leaf_hash, leaves))))


def _leaf_hash(leaf: Any) -> int:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return hash((shape_key(leaf.shape), leaf.dtype, leaf.weak_type, manual_axis_sets(leaf)))
    if type(leaf) is StaticRepr or by_text(leaf):  # as the text that stands for it when loaded from JSON
        return hash(leaf if type(leaf) is StaticRepr else as_text(leaf))
    try:
        return hash((type(leaf), static_value(leaf)))
    except Exception:  # unhashable (compared by `==` only), or a `__hash__` that raises: by its type
        return hash(type(leaf))


def pickled(treedef: jtu.PyTreeDef, leaves: Sequence[Any]) -> tuple[Any, Any]:
    """A Structure's parts as it pickles: each pickled on its own, a function-like value (in node
    data or a static leaf) that pickle would not give back as itself (a closure, a partial, an
    optax `GradientTransformation`, a bound method) as its text, a `StaticRepr`, which equals
    the original; see `picklable` for shardings."""
    return _Pickled(treedef), _Pickled(picklable(leaves))


class _Pickled:
    """A value that unpickles as itself, pickled by `_TextPickler` (nested in the user's pickle)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        out = io.BytesIO()
        _TextPickler(out, pickle.HIGHEST_PROTOCOL).dump(self.value)
        return (pickle.loads, (out.getvalue(),))


class _TextPickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is jax.ShapeDtypeStruct or not by_text(obj) or _by_reference(obj):
            return NotImplemented
        text = as_text(obj)
        return (StaticRepr, (text.type_name, text.text))


def _by_reference(x: Any) -> bool:
    """Whether pickle writes `x` by its import path, which gives back `x` itself."""
    if not isinstance(x, (types.FunctionType, types.BuiltinFunctionType, type)):
        return False
    found: Any = sys.modules.get(getattr(x, "__module__", None) or "")
    for part in str(getattr(x, "__qualname__", "<>")).split("."):
        found = getattr(found, part, None)
    return found is x


def picklable(leaves: Sequence[Any]) -> tuple[Any, ...]:
    """`leaves` as they pickle. Devices do not: a concrete sharding travels as its abstract
    form (a NamedSharding keeps its spec over the abstract mesh); as equality ignores
    sharding, the copy is equal to the original."""
    return tuple(map(_picklable_leaf, leaves))


def _picklable_leaf(leaf: Any) -> Any:
    if not isinstance(leaf, jax.ShapeDtypeStruct) or leaf.sharding is None:
        return leaf
    sharding = leaf.sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        if isinstance(sharding.mesh, jax.sharding.AbstractMesh):
            return leaf
        abstract = jax.sharding.NamedSharding(sharding.mesh.abstract_mesh, sharding.spec)
        return leaf.update(sharding=abstract)
    return leaf.update(sharding=None)
