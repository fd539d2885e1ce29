"""JSON values: the one codec for the values a treeshape document holds, and the checks of its fields.

A value is a node's data (a dataclass's `aux`, a flax.nnx or equinox
module's fields) or a static leaf. `encode` writes one, `decode` reads it back:
`str`, `int`, `bool`, `None` and finite floats as themselves, tuples and lists
tagged (`{"tuple": [...]}`), and, where the format allows more than plain data,
dicts and flax `FrozenDict`s as `[key, value]` pairs, infinities, dtypes,
enum members, functions and classes by `"module:qualname"`, and anything else
by its text (`{"repr", "type"}`, read back as a `StaticRepr`). A static leaf's
record is written from the same parts (`static_record` / `read_static`).

Reading never evaluates anything: a name is looked up in modules already in
`sys.modules`, and every field is checked, failing with `Malformed` (which
`_json.loads` turns into one `ValueError`) that says where and what.
"""

import enum
import math
import re
import sys
from typing import Any, Final, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat, _nodes
from ._dtypes import jax_dtype, key_dtype, key_dtypes
from ._tree import StaticRepr, clip


MAX_DIM: Final = 2**63 - 1  # XLA's dimension sizes are int64
_MAX_INT_VALUE: Final = 10**300  # larger static ints are kept by repr only
NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*")
_NUMERIC_NAME: Final = re.compile(r"[a-z]+[0-9]*")
_KEY_NAME: Final = re.compile(r"key<[a-z0-9_]+>")
_SCALARS: Final = (str, bool, int, float, type(None))


def short_repr(x: Any) -> str:
    try:
        text = repr(x)
    except Exception:
        text = f"<{type(x).__name__} object>"
    return clip(text, 60)


def type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


# -- encoding ------------------------------------------------------------------
def as_itself(x: Any) -> bool:
    """Whether `x` is written as itself: a JSON scalar that reads back equal."""
    kind = type(x)
    return (
        kind is str
        or kind is bool
        or x is None
        or (kind is int and abs(x) < _MAX_INT_VALUE)
        or (kind is float and math.isfinite(x))
    )


def encode(x: Any, home: str = "", plain_at: str | None = None) -> Any:
    """A value as JSON: plain data as itself, tuples, lists and dicts tagged, a dtype by name, an
    enum member, function or class by `module:qualname`, anything else by its text.

    `home` is the module of the node class whose data this is (its globals may name a default
    value, as flax.nnx.Linear's `default_kernel_init`). `plain_at`, the path of a node whose data
    must be plain (a dataclass's `aux`, compared when loading), allows only what reads back equal:
    JSON scalars and tuples and lists of them; anything else raises `TypeError`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from treeshape._json_values import decode, encode
        >>> encode((1, float("inf"), jnp.dtype("bfloat16"), jnp.tanh))
        {'tuple': [1, {'float': 'inf'}, {'dtype': 'bfloat16'}, {'name': 'jax.numpy:tanh'}]}
        >>> decode(encode([1, (None, "relu")], plain_at="tree"), "aux", plain=True)
        [1, (None, 'relu')]
    """
    if as_itself(x):
        return x
    kind = type(x)
    if kind is tuple or kind is list:
        return {kind.__name__: [encode(item, home, plain_at) for item in x]}
    if plain_at is not None:
        raise TypeError(
            f"treeshape.Structure.to_json: the pytree node at {plain_at} has node data of type "
            f"{kind.__name__} ({short_repr(x)}), which JSON cannot describe: only str, int, float, "
            "bool, None and tuples or lists of these are supported. Keep such nodes out of the tree, "
            "or pickle the Structure instead (trusted data only)."
        )
    if kind is float and not math.isnan(x):  # NaN, equal to no other NaN, is kept by its repr (as below)
        return {"float": repr(x)}
    if kind is dict and all(type(k) in (str, int) for k in x):
        return {"dict": [[k, encode(v, home)] for k, v in x.items()]}
    if _nodes.is_frozen_dict(kind) and all(type(k) in (str, int) for k in x):
        return {"frozendict": [[k, encode(v, home)] for k, v in x.items()]}
    if isinstance(x, np.dtype) and jax_dtype(x):
        return {"dtype": dtype_name(x)}
    if isinstance(x, enum.Enum) and kind.__members__.get(x.name) is x:
        enum_name = object_name(kind)  # `jax.lax.Precision.HIGHEST`: by its class's name and its own
        if enum_name is not None:
            return {"enum": enum_name, "member": x.name}
    name = object_name(x) or _global_name(x, home)
    if name is not None:
        return {"name": name}
    if kind is StaticRepr:
        return {"repr": x.text, "type": x.type_name}
    return {"repr": _nodes.static_text(x), "type": type_name(kind)}


def static_record(path: str, leaf: Any) -> dict[str, Any]:
    """A static leaf's record: no shape, dtype or weak_type; its text as `static` and its type's
    name as `type` (all a `StaticRepr` knows), and the value itself (`value`) or its `name`
    where `encode` writes it so."""
    record: dict[str, Any] = {"path": path, "shape": None, "dtype": None, "weak_type": None}
    if type(leaf) is StaticRepr:
        return {**record, "static": leaf.text, "type": leaf.type_name}
    record.update(static=_nodes.static_text(leaf), type=type_name(type(leaf)))
    name = object_name(leaf)
    if name is not None:  # a function or class: found again by this name when loading, if imported
        record["name"] = name
    if as_itself(leaf):
        record["value"] = leaf
    return record


def object_name(x: Any) -> str | None:
    """`"module:qualname"` of a function or class where users import it from (`"jax.nn:gelu"`,
    as `_nodes.public_name` finds it) that this name finds again in `sys.modules` (so loading
    gives back the same object), else None."""
    found = _nodes.public_name(x)
    if found is None:
        return None
    name = ":".join(found)
    try:
        if NAME.fullmatch(name) and lookup(name, "") is x:
            return name
    except Malformed:
        pass
    return None


def _global_name(x: Any, home: str) -> str | None:
    """`"home:name"` for a function that module `home` holds as a global (a class's default, such
    as flax.nnx.Linear's `default_kernel_init`, a closure with no name of its own), else None."""
    if not home or not callable(x) or isinstance(x, type):
        return None
    namespace = getattr(sys.modules.get(home), "__dict__", {})
    found = next((name for name, value in list(namespace.items()) if value is x), None)
    return f"{home}:{found}" if found is not None and NAME.fullmatch(f"{home}:{found}") else None


def dtype_name(dtype: Any) -> str:
    if jnp.issubdtype(dtype, jax.dtypes.extended):
        return str(dtype)
    return str(np.dtype(dtype).name)


# -- decoding: the document's fields --------------------------------------------------
class Malformed(Exception):
    """Raised inside the decoder; `_json.loads` turns it into one ValueError."""


def fail(where: str, message: str) -> NoReturn:
    raise Malformed(f"{where}: {message}")


def get(record: dict[str, Any], key: str, where: str) -> Any:
    if key not in record:
        fail(where, f"missing the key {key!r}")
    return record[key]


def read_int(x: Any, where: str, low: int = 0, high: int = MAX_DIM) -> int:
    if type(x) is not int or not low <= x <= high:
        fail(where, f"expected an integer in [{low}, {high}], got {short_repr(x)}")
    return int(x)


def read_str(x: Any, where: str) -> str:
    if type(x) is not str:
        fail(where, f"expected a string, got {short_repr(x)}")
    return str(x)


def read_list(x: Any, where: str) -> list[Any]:
    if type(x) is not list:
        fail(where, f"expected a list, got {short_repr(x)}")
    return list(x)


def read_str_list(x: Any, where: str, unique: bool = True) -> list[str]:
    items = [read_str(item, f"{where}[{i}]") for i, item in enumerate(read_list(x, where))]
    if unique and len(set(items)) != len(items):
        fail(where, f"names must be unique, got {short_repr(items)}")
    return items


def read_bool(x: Any, where: str) -> bool:
    if type(x) is not bool:
        fail(where, f"expected true or false, got {short_repr(x)}")
    return bool(x)


def lookup(name: Any, where: str) -> Any:
    """The object named `"module:qualname"`, from a module that is already imported."""
    text = read_str(name, where)
    if not NAME.fullmatch(text):
        fail(where, f"expected a name 'module:qualname', got {short_repr(text)}")
    module_name, qualname = text.split(":", 1)
    module = sys.modules.get(module_name)
    if module is None:
        fail(
            where,
            f"{text} names the module {module_name!r}, which is not imported; import it before loading "
            "(treeshape never imports a module named in JSON)",
        )
    obj: Any = module
    for part in qualname.split("."):
        namespace: Any = getattr(obj, "__dict__", None)  # not getattr(obj, part): it may import
        if not isinstance(namespace, dict) and not hasattr(namespace, "get"):
            fail(where, f"{text} is not defined in {module_name!r}")
        if part not in namespace:
            fail(where, f"{text} is not defined in {module_name!r}")
        obj = namespace[part]
    return obj


def lookup_type(name: Any, where: str) -> type:
    cls = lookup(name, where)
    if not isinstance(cls, type) or type_name(cls) != name:
        fail(where, f"{name} is not a class defined under that name")
    return cls


_dtype_table: dict[str, Any] = {}


def _dtypes() -> dict[str, Any]:
    """Every dtype name JAX can hold: NumPy and ml_dtypes types, and the built-in PRNG key types."""
    if not _dtype_table:
        table: dict[str, Any] = {}
        for name in dir(jnp):
            obj = getattr(jnp, name)
            dtype = getattr(obj, "dtype", None)
            if isinstance(obj, type) and isinstance(dtype, np.dtype) and dtype.kind != "O":
                table[dtype.name] = dtype
        table.update(key_dtypes())
        _dtype_table.update(table)
    return _dtype_table


def read_dtype(x: Any, where: str) -> Any:
    name = read_str(x, where)
    dtype = _dtypes().get(name)
    if dtype is None and _NUMERIC_NAME.fullmatch(name):
        try:  # other NumPy numeric types (e.g. float128); the regex keeps out dtype mini-languages
            candidate = np.dtype(name)
        except TypeError:
            candidate = None
        if candidate is not None and candidate.name == name and candidate.kind in "biufc":
            dtype = candidate
    if dtype is None and _KEY_NAME.fullmatch(name):
        try:  # a key type of a release newer than this one: say which
            key_dtype(name[4:-1])
        except _compat.JaxReleaseError as err:
            fail(where, str(err))
        except ValueError:
            pass
    if dtype is None:
        fail(where, f"unknown dtype {short_repr(name)}")
    return dtype


# -- decoding: values ------------------------------------------------------------------
def decode(x: Any, where: str, plain: bool = False) -> Any:
    """A value written by `encode` (with `plain_at` where `plain`): nothing is evaluated, a name
    is looked up among the modules already imported, and a value kept by its text comes back as
    a `StaticRepr`."""
    if type(x) in _SCALARS:
        return x
    if type(x) is dict and len(x) == 1:
        [(tag, value)] = x.items()
        if tag in ("tuple", "list"):
            items = read_list(value, where if plain else f"{where}.{tag}")
            decoded = [decode(item, f"{where}[{i}]", plain) for i, item in enumerate(items)]
            return tuple(decoded) if tag == "tuple" else decoded
    if plain:
        fail(where, f"expected plain data (a JSON scalar or {{'tuple'|'list': [...]}}), got {short_repr(x)}")
    if type(x) is dict and set(x) == {"repr", "type"}:
        text = read_str(x["type"], f"{where}.type")
        if not NAME.fullmatch(text):
            fail(f"{where}.type", f"expected a name 'module:qualname', got {short_repr(text)}")
        return StaticRepr(text, read_str(x["repr"], f"{where}.repr"))
    if type(x) is dict and set(x) == {"enum", "member"}:
        return _enum_member(x["enum"], x["member"], where)
    if type(x) is dict and len(x) == 1:
        [(tag, value)] = x.items()
        if tag in ("dict", "frozendict"):
            at = f"{where}.{tag}"
            pairs = [_dict_item(item, f"{at}[{i}]") for i, item in enumerate(read_list(value, at))]
            if len({(type(k), k) for k, _ in pairs}) != len(pairs):
                fail(at, "dict keys must be unique")
            return dict(pairs) if tag == "dict" else _frozen_dict(pairs, at)
        if tag == "float" and value in ("inf", "-inf"):
            return float(value)
        if tag == "dtype":
            return read_dtype(value, f"{where}.dtype")
        if tag == "name":
            return named(value, f"{where}.name")
    return fail(where, f"expected a value as to_json writes node data, got {short_repr(x)}")


def read_static(record: dict[str, Any], where: str) -> Any:
    """The static leaf of a record written by `static_record`: its value or the named object
    where the record has them, else a `StaticRepr` of its text."""
    for field in ("shape", "dtype", "weak_type"):
        if record.get(field) is not None:
            fail(f"{where}.{field}", "a static leaf has no shape, dtype or weak_type (expected null)")
    text = read_str(get(record, "static", where), f"{where}.static")
    name = read_str(get(record, "type", where), f"{where}.type")
    if "value" in record:
        value = record["value"]
        expected = {
            "builtins:str": str,
            "builtins:int": int,
            "builtins:float": float,
            "builtins:bool": bool,
            "builtins:NoneType": type(None),
        }.get(name)
        if expected is None or type(value) is not expected:
            fail(f"{where}.value", f"a value of type {name} cannot be {short_repr(value)}")
        return value
    if name == "builtins:float" and text in ("nan", "inf", "-inf"):
        return float(text)
    if "name" in record:  # a function or class: itself if its module is imported, else known by its repr
        try:
            return named(record["name"], f"{where}.name")
        except Malformed:
            if not NAME.fullmatch(read_str(record["name"], f"{where}.name")):
                raise
    return StaticRepr(name, text)


def _enum_member(name: Any, member: Any, where: str) -> Any:
    """The member `member` of the enum class `name`, from a module already imported (read from
    the class's members: no code runs)."""
    cls = lookup(name, f"{where}.enum")
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        fail(f"{where}.enum", f"{name} is not an enum class")
    found = cls.__members__.get(read_str(member, f"{where}.member"))
    if found is None:
        fail(f"{where}.member", f"{name} has no member {short_repr(member)}")
    return found


def _frozen_dict(pairs: list[tuple[Any, Any]], where: str) -> Any:
    """A flax `FrozenDict` of these items (node data of a flax model, which has imported flax)."""
    frozen_dict = _nodes.frozen_dict_type()
    if frozen_dict is None:
        fail(where, "a flax FrozenDict, but flax.core is not imported; import it before loading")
    return frozen_dict(dict(pairs))


def named(name: Any, where: str) -> Any:
    """The function or class `name` (`"module:qualname"`, or `"module:global"` for a lambda bound
    to a module global), from a module already imported."""
    found = lookup(name, where)
    if not (callable(found) or isinstance(found, type)):
        fail(where, f"{name} is not a function or class")
    return found


def _dict_item(x: Any, where: str) -> tuple[Any, Any]:
    if type(x) is not list or len(x) != 2 or type(x[0]) not in (str, int):
        fail(where, f"expected [key, value] with a string or integer key, got {short_repr(x)}")
    return x[0], decode(x[1], f"{where}[1]")
