"""`ts.describe(tree, depth=N)` (API.md section 13): memory by module, one row per path prefix,
as text, as HTML in a notebook, and on the command line (`treeshape inspect --depth N`)."""

import html

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

import treeshape as ts
from treeshape._cli import main


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
    assert main(["inspect", "cli_fixtures:mlp", "f32[8,784]", "--depth", "1"]) == 0
    assert capsys.readouterr().out == (
        "path        leaves  params  bytes\n"
        "----------  ------  ------  -----\n"
        "['logits']       1      80  320 B\n"
        "----------  ------  ------  -----\n"
        "total            1      80  320 B\n"
    )
    assert main(["inspect", "cli_fixtures:mlp", "f32[8,784]", "--depth", "-1"]) == 2
    assert "argument --depth: expected an integer >= 0, got '-1'" in capsys.readouterr().err
    assert main(["inspect", "cli_fixtures:mlp", "f32[8,784]", "--depth", "1", "--json"]) == 2
    assert "give one of the two" in capsys.readouterr().err
