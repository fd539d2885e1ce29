"""Tables: `str(Structure)`, `ts.describe` (also memory by path prefix with `depth=N`, as text,
as HTML in a notebook, and as `treeshape inspect --depth N`), `_repr_html_` (golden strings)."""

import collections
import dataclasses
import enum
import html

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

import treeshape as ts
from treeshape._cli import main
from treeshape._table import html_table, table


# How a weak Python scalar shows: 64-bit under `jax_enable_x64`, 32-bit otherwise.
# The short names and byte counts have the same width in both modes.
X64 = jax.config.jax_enable_x64
WF, WI, SB = ("~f64", "~i64", 8) if X64 else ("~f32", "~i32", 4)


def relu(x):
    return x


class Opaque:
    pass


class Activation(enum.Enum):
    RELU = 1


def test_weak_bf16_and_numpy_leaves():
    tree = {
        "params": {"w": jnp.zeros((2, 3), jnp.bfloat16), "b": jnp.zeros(3, jnp.float32)},
        "step": 0,
        "lr": 0.5,
        "mask": np.ones(4, bool),
    }
    assert str(ts.structure_of(tree)) == (
        "path             shape  dtype  bytes\n"
        "---------------  -----  -----  -----\n"
        f"['lr']           []     {WF}     {SB} B\n"
        "['mask']         [4]    bool     4 B\n"
        "['params']['b']  [3]    f32     12 B\n"
        "['params']['w']  [2,3]  bf16    12 B\n"
        f"['step']         []     {WI}     {SB} B\n"
        "---------------  -----  -----  -----\n"
        f"total: 5 leaves, 15 elements    {28 + 2 * SB} B"
    )


def test_typed_keys_and_static_leaves():
    tree = {
        "key": jax.random.key(0),
        "keys": jax.random.split(jax.random.key(1), 4),
        "act": relu,
        "name": "mlp",
        "obj": Opaque(),
        "tup": (1.0, None),
    }
    assert ts.describe(tree) == (
        "path        shape  dtype     extra                              bytes\n"
        "----------  -----  --------  ---------------------------------  -----\n"
        "['act']                      static function test_display.relu\n"
        "['key']     []     key<fry>                                       8 B\n"
        "['keys']    [4]    key<fry>                                      32 B\n"
        "['name']                     static str 'mlp'\n"
        "['obj']                      static Opaque\n"
        f"['tup'][0]  []     {WF}                                           {SB} B\n"
        "----------  -----  --------  ---------------------------------  -----\n"
        f"total: 6 leaves, 6 elements                                      {40 + SB} B"
    )


def test_sharded_leaves_show_their_partition_spec():
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)

    def sharding(*spec):
        return jax.NamedSharding(mesh, P(*spec))

    tree = {
        "emb": jax.ShapeDtypeStruct((1024, 64), jnp.float32, sharding=sharding("model", None)),
        "w": jax.device_put(jnp.zeros((16, 8), jnp.float32), sharding(("data", "model"), None)),
        "b": jax.device_put(jnp.zeros(8, jnp.float32), sharding()),  # replicated: marked
    }
    # Some leaf is split: a per-device column (the largest shard) and its total.
    assert ts.describe(tree) == (
        "path     shape      dtype  extra                           bytes  per device\n"
        "-------  ---------  -----  --------------------------  ---------  ----------\n"
        "['b']    [8]        f32    replicated                       32 B        32 B\n"
        "['emb']  [1024,64]  f32    P('model', None)            256.0 KiB    64.0 KiB\n"
        "['w']    [16,8]     f32    P(('data', 'model'), None)      512 B        64 B\n"
        "-------  ---------  -----  --------------------------  ---------  ----------\n"
        "total: 3 leaves, 65,672 elements                       256.5 KiB    64.1 KiB"
    )


def test_a_split_leaf_among_static_leaves_shows_the_per_device_column():
    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
    split = jax.ShapeDtypeStruct((16,), jnp.float32, sharding=jax.NamedSharding(mesh, P("i")))
    assert ts.describe({"act": "relu", "w": split}) == (
        "path     shape  dtype  extra              bytes  per device\n"
        "-------  -----  -----  -----------------  -----  ----------\n"
        "['act']                static str 'relu'\n"
        "['w']    [16]   f32    P('i',)             64 B         8 B\n"
        "-------  -----  -----  -----------------  -----  ----------\n"
        "total: 2 leaves, 16 elements               64 B         8 B"
    )
    assert ts.describe({"act": "relu", "w": jax.ShapeDtypeStruct((16,), jnp.float32)}).splitlines()[0] == (
        "path     shape  dtype  extra              bytes"
    )


def test_varying_leaves_under_shard_map():
    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
    tables = []

    def body(x):
        tree = {"x": x, "y": x.sum(), "total": jax.lax.psum(x.sum(), "i")}
        tables.append(ts.describe(tree))
        return x

    xs = jax.device_put(jnp.zeros(16, jnp.float32), jax.NamedSharding(mesh, P("i")))
    jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(xs)
    assert tables == [
        "path       shape  dtype  extra  bytes\n"
        "---------  -----  -----  -----  -----\n"
        "['total']  []     f32             4 B\n"
        "['x']      [2]    f32    {V:i}    8 B\n"
        "['y']      []     f32    {V:i}    4 B\n"
        "---------  -----  -----  -----  -----\n"
        "total: 3 leaves, 4 elements      16 B"
    ]


def test_max_rows_cut_keeps_the_total_exact():
    big = {"layers": [{"w": jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16)} for _ in range(80)]}
    assert ts.describe(big, max_rows=4) == (
        "path                 shape        dtype      bytes\n"
        "-------------------  -----------  -----  ---------\n"
        "['layers'][0]['w']   [8192,8192]  bf16   128.0 MiB\n"
        "['layers'][1]['w']   [8192,8192]  bf16   128.0 MiB\n"
        "... 76 more leaves\n"
        "['layers'][78]['w']  [8192,8192]  bf16   128.0 MiB\n"
        "['layers'][79]['w']  [8192,8192]  bf16   128.0 MiB\n"
        "-------------------  -----------  -----  ---------\n"
        "total: 80 leaves, 5,368,709,120 elements  10.0 GiB"
    )


@pytest.mark.parametrize("max_rows, shown", [(0, 0), (1, 1), (3, 3), (9, 9), (10, 10), (None, 10)])
def test_max_rows_counts(max_rows, shown):
    s = ts.structure_of([jnp.zeros(2, jnp.float32)] * 10)
    text = table(s, max_rows=max_rows)
    rows = [line for line in text.splitlines() if line.startswith("[")]
    assert len(rows) == shown
    hidden = 10 - shown
    assert (f"... {hidden} more leaves" in text) == (hidden > 1)
    assert ("... 1 more leaf\n" in text) == (hidden == 1)
    assert text.endswith("total: 10 leaves, 20 elements  80 B")


Pair = collections.namedtuple("Pair", "first second")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Block:
    w: object
    meta: str = dataclasses.field(default="dense", metadata={"static": True})


def _odd_tree():
    """Every kind of node in a big tree: the paths of a cut table's rows must be the leaves' own."""
    sds = jax.ShapeDtypeStruct((2,), jnp.float32)
    return {
        "it's": Pair(Block(sds), [None, sds, ()]),
        "ints": {10: None, 1: collections.OrderedDict([("z", sds), ("a", (sds, {}))])},
        "layers": [{"x": sds, "y": [sds, sds]} for _ in range(300)],
        "\u00e9 tail": collections.defaultdict(list, {"k": Pair(sds, "relu")}),
    }


@pytest.mark.parametrize("max_rows", [2, 5, 50])
def test_cut_table_rows_show_the_paths_of_their_leaves(max_rows):
    s = ts.structure_of(_odd_tree())
    n = len(s)
    head = (max_rows + 1) // 2
    shown = [*range(head), *range(n - (max_rows - head), n)]
    rows = [line for line in ts.describe(s, max_rows=max_rows).splitlines()[2:-2] if not line.startswith("...")]
    assert [row.split("  ")[0] for row in rows] == [s.paths[i] for i in shown]
    assert rows[0].startswith("['ints'][1]['z']") and rows[-1].startswith("['\u00e9 tail']['k'].second")


def test_cut_table_totals_count_every_leaf():
    tree = {"keys": jax.random.split(jax.random.key(0), 3), "act": "relu", "w": [jnp.zeros((2, 3), jnp.bfloat16)] * 40}
    s = ts.structure_of(tree)
    last = ts.describe(s, max_rows=4).splitlines()[-1]
    assert (len(s), s.size, s.nbytes) == (42, 243, 24 + 480)
    assert last.startswith("total: 42 leaves, 243 elements") and last.endswith(" 504 B")


def test_a_static_leaf_loaded_from_json_shows_its_type_and_that_only_its_repr_is_known():
    s = ts.Structure.from_json(ts.structure_of({"act": Activation.RELU, "x": jnp.zeros(2, jnp.float32)}).to_json())
    row = ts.describe(s).splitlines()[2]
    assert row == "['act']                static Activation <Activation.RELU: 1> (repr from JSON)"


def test_default_cut_applies_to_str_and_describe():
    s = ts.structure_of(list(range(200)))
    assert str(s) == ts.describe(s) == ts.describe(list(range(200))) == table(s)
    assert "... 150 more leaves" in str(s)
    assert len(ts.describe(s, max_rows=None).splitlines()) == 200 + 4


def test_root_leaf_and_empty_tree():
    assert ts.describe(jnp.zeros(3, jnp.float32)) == (
        "path    shape  dtype  bytes\n"
        "------  -----  -----  -----\n"
        "(root)  [3]    f32     12 B\n"
        "------  -----  -----  -----\n"
        "total: 1 leaf, 3 elements  12 B"
    )
    assert ts.describe({}).endswith("----\ntotal: 0 leaves, 0 elements  0 B")


def test_negative_max_rows_is_an_error():
    with pytest.raises(ValueError, match="max_rows"):
        ts.describe([1], max_rows=-1)


def test_describe_in_every_context(in_context):
    def f(x):
        text = ts.describe({"x": x})
        assert "['x']  [3]    f32" in text
        assert text.splitlines()[-1].startswith("total: 1 leaf, 3 elements")
        return x

    in_context(f, jnp.ones(3, jnp.float32))


# -- HTML ----------------------------------------------------------------------------
def test_html_escapes_paths_and_static_values():
    s = ts.structure_of({"<b>": jnp.zeros(2), "s": "<script>&"})
    out = s._repr_html_()
    assert "<b>" not in out and "<script>" not in out
    assert html.escape("['<b>']") in out
    assert html.escape("static str '<script>&'") in out
    assert out.startswith('<table class="treeshape-structure"')


def test_html_has_the_cells_of_the_text_table():
    big = [jnp.zeros((2, 2), jnp.bfloat16)] * 7 + [jax.random.key(0)]
    s = ts.structure_of(big)
    out = html_table(s, max_rows=4)
    assert out.count("<tr>") == 1 + 4 + 1 + 1  # header, rows, cut, total
    assert "... 4 more leaves" in out
    assert "<td" in out and "[2,2]" in out and "bf16" in out and "key&lt;fry&gt;" in out
    assert "total: 8 leaves, 29 elements" in out and ">64 B<" in out
    assert s._repr_html_() == html_table(s)


def test_treescope_renders_a_foldable_tree_of_compact_leaves():
    import treescope  # a test extra: treeshape itself never imports it

    s = ts.structure_of({"w": jnp.zeros((2, 3), jnp.float32), "act": "relu", "k": (0.5, [jnp.zeros(2, jnp.bfloat16)])})
    text = treescope.render_to_text(s)
    weak = "~f64[]" if jax.config.jax_enable_x64 else "~f32[]"
    assert text.startswith("Structure(\n  tree={'act': 'relu', ")
    assert "'w': f32[2,3]}" in text and f"'k': ({weak}, [bf16[2]])" in text
    assert "leaves=4," in text and "object at 0x" not in text
    (b,) = jax.export.symbolic_shape("b")
    text = treescope.render_to_text(ts.structure_of({"x": jax.ShapeDtypeStruct((3 * b,), jnp.float32)}))
    assert "size=3*b," in text and "nbytes=12*b B" in text and " at 0x" not in text and "_DimExpr" not in text


@pytest.mark.parametrize("max_rows", [2, 5, 50])
def test_a_cut_table_is_the_same_read_from_a_tree_rebuilt_or_with_every_path_known(max_rows):
    sds = jax.ShapeDtypeStruct((2,), jnp.float32)
    tree = {**_odd_tree(), "b": {"z": [sds] * 60, "a": sds}}  # a user's dict, its keys not in JAX's order
    read = ts.structure_of(tree)  # notes the paths at both ends while it has the tree
    rebuilt = ts.Structure(read.treedef, read.leaves)  # knows none: rebuilds the tree once
    known = ts.structure_of(tree)
    assert len(known.paths) == len(read)  # every path memoised
    assert table(read, max_rows) == table(rebuilt, max_rows) == table(known, max_rows)
    assert html_table(read, max_rows) == html_table(rebuilt, max_rows)
    assert table(read, max_rows).splitlines()[2].startswith("['b']['a']")


# -- describe(tree, depth=N): memory by module, one row per path prefix ----------------------------
F32 = jnp.float32


MODEL = {
    "encoder": {
        "layers": [{"w": jax.ShapeDtypeStruct((64, 64), F32), "b": jax.ShapeDtypeStruct((64,), F32)}] * 2,
        "norm": jax.ShapeDtypeStruct((64,), jnp.bfloat16),
    },
    "head": jax.ShapeDtypeStruct((64, 10), F32),
    "act": "relu",
}


def test_one_row_per_path_prefix_in_tree_order_with_a_total():
    assert ts.describe(MODEL, depth=2) == (
        "path                   leaves  params     bytes\n"
        "---------------------  ------  ------  --------\n"
        "['act']                     1       0       0 B\n"
        "['encoder']['layers']       4   8,320  32.5 KiB\n"
        "['encoder']['norm']         1      64     128 B\n"
        "['head']                    1     640   2.5 KiB\n"
        "---------------------  ------  ------  --------\n"
        "total                       7   9,024  35.1 KiB"
    )
    assert ts.describe(MODEL, depth=3).splitlines()[3:5] == [
        "['encoder']['layers'][0]       2   4,160  16.2 KiB",
        "['encoder']['layers'][1]       2   4,160  16.2 KiB",
    ]


def test_depth_zero_is_the_whole_tree_and_a_deep_depth_is_a_row_per_leaf():
    s = ts.structure_of(MODEL)
    rows = ts.describe(s, depth=0).splitlines()
    assert rows[2] == "(root)       7   9,024  35.1 KiB" and rows[-1] == "total        7   9,024  35.1 KiB"
    deep = ts.describe(s, depth=10).splitlines()[2:-2]
    assert [row.split()[0] for row in deep] == list(s.paths)  # leaves less deep than 10 keys: their own rows
    assert [row.split()[1] for row in deep] == ["1"] * len(s)


def test_sharded_leaves_add_bytes_per_device():
    mesh = AbstractMesh((4,), ("fsdp",))
    s = ts.structure_of(MODEL).with_shardings(
        lambda path, leaf: NamedSharding(mesh, P("fsdp")) if leaf.shape[0] == 64 and leaf.ndim == 2 else None
    )
    assert ts.describe(s, depth=1) == (
        "path         leaves  params     bytes  per device\n"
        "-----------  ------  ------  --------  ----------\n"
        "['act']           1       0       0 B         0 B\n"
        "['encoder']       5   8,384  32.6 KiB     8.6 KiB\n"
        "['head']          1     640   2.5 KiB       640 B\n"
        "-----------  ------  ------  --------  ----------\n"
        "total             7   9,024  35.1 KiB     9.2 KiB"
    )
    assert s.nbytes_per_device == 9 * 1024 + 256  # the total is the Structure's own figure


def test_a_notebook_shows_the_html_table_with_or_without_depth():
    for described in (ts.describe(MODEL), ts.describe(MODEL, depth=1)):
        assert isinstance(described, str)
        page = described._repr_html_()
        assert page.startswith('<table class="treeshape-structure"')
        for line in described.splitlines()[2:-2]:
            assert html.escape(line.split("  ")[0]) in page  # every row's path
    assert "<th" in ts.describe(MODEL, depth=1)._repr_html_() and "8,384" in ts.describe(MODEL, depth=1)._repr_html_()
    assert ts.describe(MODEL) == str(ts.structure_of(MODEL))  # without depth: the Structure's table


def test_long_tables_are_cut_and_the_total_counts_everything():
    tree = {f"layer{i:02d}": {"w": jax.ShapeDtypeStruct((2, 2), F32)} for i in range(30)}
    described = ts.describe(tree, depth=1, max_rows=4)
    assert described == (
        "path         leaves  params  bytes\n"
        "-----------  ------  ------  -----\n"
        "['layer00']       1       4   16 B\n"
        "['layer01']       1       4   16 B\n"
        "... 26 more rows\n"
        "['layer28']       1       4   16 B\n"
        "['layer29']       1       4   16 B\n"
        "-----------  ------  ------  -----\n"
        "total            30     120  480 B"
    )
    page = described._repr_html_()
    assert page.count("<tr>") == 1 + 4 + 1 + 1  # the header, four rows, the cut, the total
    assert '<td colspan="4" style="text-align: left">... 26 more rows</td>' in page


@pytest.mark.parametrize("depth", [-1, 1.5, "1", True, jnp.int32(1)])
def test_a_bad_depth_is_a_value_error_naming_describe(depth):
    with pytest.raises(ValueError) as info:
        ts.describe(MODEL, depth=depth)
    assert str(info.value) == (
        "treeshape.describe: `depth` must be None or an int >= 0 (how many keys of each path make a row; None: a "
        f"row per leaf), got {type(depth).__name__} {depth!r}."
    )
    with pytest.raises(ValueError, match=r"^treeshape\.describe: `max_rows` must be None or an int >= 0"):
        ts.describe(MODEL, max_rows=depth)


def test_a_numpy_integer_depth_is_an_int():
    assert ts.describe(MODEL, depth=np.int64(1)) == ts.describe(MODEL, depth=1)
    assert ts.describe(MODEL, max_rows=np.int64(2)) == ts.describe(MODEL, max_rows=2)


def test_the_command_line_takes_depth(capsys):
    assert main(["inspect", "helpers:mlp", "f32[8,784]", "--depth", "1"]) == 0
    assert capsys.readouterr().out == (
        "path        leaves  params  bytes\n"
        "----------  ------  ------  -----\n"
        "['logits']       1      80  320 B\n"
        "----------  ------  ------  -----\n"
        "total            1      80  320 B\n"
    )
    assert main(["inspect", "helpers:mlp", "f32[8,784]", "--depth", "-1"]) == 2
    assert "argument --depth: expected an integer >= 0, got '-1'" in capsys.readouterr().err
    assert main(["inspect", "helpers:mlp", "f32[8,784]", "--depth", "1", "--json"]) == 2
    assert "give one of the two" in capsys.readouterr().err
