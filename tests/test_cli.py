"""The `treeshape` command: `python -m treeshape` for exit codes and stderr,
`main(argv)` in-process for the rest. Functions to inspect live in
`tests/helpers.py`."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from helpers import assert_one_line_error

from treeshape._cli import main


TESTS = pathlib.Path(__file__).parent

# The dtypes JAX gives the literals `3` and `0.5`: 64-bit under `jax_enable_x64`
# (the subprocesses inherit JAX_ENABLE_X64), 32-bit otherwise.
INT = jax.dtypes.canonicalize_dtype(jnp.int64)
FLOAT = jax.dtypes.canonicalize_dtype(jnp.float64)
# A literal one past the default int's range (3e9 > 2**31, 3e19 > 2**63).
TOO_BIG = "3" + "0" * (9 if INT == jnp.int32 else 19)


def run(*argv, cwd=TESTS, **env_vars):
    """`python -m treeshape ARGV` in `cwd` (where `helpers` is importable), with
    `env_vars` (such as `JAX_ENABLE_X64="0"`) added to the environment."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **env_vars}
    return subprocess.run(
        [sys.executable, "-m", "treeshape", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


EVERY_SPEC = [
    "f32[8,784]",
    "bf16[]",
    "i32[3]",
    "u8[2,2]",
    "bool[4]",
    "c64[2]",
    "float32[3]",
    "0.5",
    "3",
    "True",
    "~f32[]",
    "~i32[]",
    "key<fry>[2]",
    "key<rbg>[]",
    "key<unsafe_rbg>[3]",
    "(f32[2],i32[])",
    "(bf16[1], (0, [~f32[], 'a,b)']))",
    "scale=bf16[2]",
    "flag=False",
    "axis=0",
]


def _entry(path, shape, dtype, weak_type=False):
    return {"path": path, "shape": shape, "dtype": dtype, "weak_type": weak_type}


EVERY_SPEC_JSON = [
    _entry("['args'][0]", [8, 784], "float32"),
    _entry("['args'][1]", [], "bfloat16"),
    _entry("['args'][2]", [3], "int32"),
    _entry("['args'][3]", [2, 2], "uint8"),
    _entry("['args'][4]", [4], "bool"),
    _entry("['args'][5]", [2], "complex64"),
    _entry("['args'][6]", [3], "float32"),
    _entry("['args'][7]", [], FLOAT.name, weak_type=True),
    _entry("['args'][8]", [], INT.name, weak_type=True),
    _entry("['args'][9]", [], "bool"),
    _entry("['args'][10]", [], "float32", weak_type=True),
    _entry("['args'][11]", [], "int32", weak_type=True),
    _entry("['args'][12]", [2], "key<fry>"),
    _entry("['args'][13]", [], "key<rbg>"),
    _entry("['args'][14]", [3], "key<urbg>"),
    _entry("['args'][15][0]", [2], "float32"),
    _entry("['args'][15][1]", [], "int32"),
    _entry("['args'][16][0]", [1], "bfloat16"),
    _entry("['args'][16][1][0]", [], INT.name, weak_type=True),
    _entry("['args'][16][1][1][0]", [], "float32", weak_type=True),
    {**_entry("['args'][16][1][1][1]", None, None, None), "static": "'a,b)'", "type": "builtins:str", "value": "a,b)"},
    _entry("['kwargs']['axis']", [], INT.name, weak_type=True),
    _entry("['kwargs']['flag']", [], "bool"),
    _entry("['kwargs']['scale']", [2], "bfloat16"),
]


# -- subprocess: the real command ------------------------------------------------
def test_every_spec_form_and_kwargs_as_json():
    result = run("inspect", "helpers:echo", *EVERY_SPEC, "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert json.loads(result.stdout) == EVERY_SPEC_JSON


def test_demo_runs_offline_and_the_loss_goes_down():
    result = run("demo")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    for heading in ("1. The parameters", "2. The optimizer state", "3. The scan carry"):
        assert heading in out
    # Step 3 shows a carry mismatch reported (the bfloat16 moments come back as
    # float32) and then fixed with the policy the message names.
    mismatch, fixed = out.split("3. The scan carry", 1)[1].split("The fix it names:", 1)
    mismatch = " ".join(mismatch.split())  # the message is wrapped for the terminal
    assert "CarryMismatchError: treeshape.scan_carry: no carry type is a fixed point" in mismatch
    f = "f64" if jax.config.jax_enable_x64 else "f32"  # the demo's default float
    assert f"carry[1]['mu']['hidden']['b']: input bf16[32], output {f}[32]" in mismatch
    assert f'policy="promote" would (bf16 promotes to {f})' in mismatch
    assert fixed.lstrip().startswith('ts.scan_carry(train_step, init, xs, policy="promote")')
    assert "the initial carry matches it: True" in fixed
    losses = [float(x) for x in re.findall(r"mean loss (\d+\.\d+)", out)]
    assert len(losses) >= 3
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] / 2
    assert re.search(r"CacheInfo\(hits=[1-9]\d*, misses=\d+", out)
    # then what its train step costs, the largest batch that fits and (libtpu is in the
    # `test` extra) its time and plan on a v5e, with no line of libtpu's on stderr
    for heading in ("6. What one train step needs", "7. The largest batch that fits", "8. On a TPU v5e, compiled"):
        assert heading in out


def _demo_sections(out):
    """The demo's numbered sections by number, each with its whitespace collapsed (lines
    are wrapped for the terminal)."""
    parts = re.split(r"^(\d)\. ", out, flags=re.MULTILINE)
    return {int(n): " ".join(text.split()) for n, text in zip(parts[1::2], parts[2::2], strict=True)}


def test_demo_shows_its_train_steps_cost_largest_batch_and_v5e_time_and_plan(capsys):
    """The figures of sections 6-8 are those ts.cost, ts.largest_fit and ts.plan give for the
    demo's train step (its state donated), its budget and its plan's choices."""
    import treeshape as ts
    from treeshape._cli import _demo

    assert main(["demo"]) == 0
    sections = _demo_sections(capsys.readouterr().out)
    assert sorted(sections) == [1, 2, 3, 4, 5, 6, 7, 8]
    m = _demo.model()
    carry, batch = (m.params, m.adam_init(m.params)), (m.x[0, 0], m.y[0, 0])

    c = ts.cost(m.train_step, carry, batch, donate_argnums=0)
    assert f"a batch of 64 rows peak {c.peak_bytes / 1024:.1f} KiB per device" in sections[6]
    assert f"temporaries {c.temp_bytes / 1024:.1f} KiB; {c.flops:,.0f} FLOPs" in sections[6]

    fit = ts.largest_fit(*m.make(batch[0].dtype.name), dim="b", budget=2**20, donate_argnums=0)
    assert 64 < fit.size < 2**20 // 64  # the budget bounds it, well above the batch of 64
    shown = f"b = {fit.size:,}: peak {fit.cost.peak_bytes:,} B of 1,048,576; "
    shown += f"{fit.fixed_bytes / 1024:.1f} KiB fixed and {round(fit.per_unit_bytes)} B a row"
    assert re.search(re.escape(shown) + r" \(\d+ programs? compiled\)$", sections[7])

    t = ts.cost(m.train_step, carry, batch, donate_argnums=0, target="v5e").time
    assert t.seconds > 0 and " ".join(t.line().split()) in sections[8]
    plan = ts.plan(m.make, {"dtype": ["float32", "bfloat16"]}, target="v5e", donate_argnums=0, max_size=16)
    assert " ".join(str(plan).split()) in sections[8]
    best = plan.best
    assert f"best: {best.choice} at b={best.size}, {best.throughput:,.0f} rows/s" in sections[8]


def test_demo_without_libtpu_names_the_tpu_extra_and_still_shows_the_rest(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "libtpu", None)  # as Python has it for a module not installed
    assert main(["demo"]) == 0
    sections = _demo_sections(capsys.readouterr().out)
    assert sorted(sections) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sections[8].startswith('On a TPU v5e: not here. treeshape.cost: target="v5e" compiles with libtpu')
    assert 'pip install "treeshape[tpu]"' in sections[8] and "largest" not in sections[8]
    assert "Then run the demo again" in sections[8]


BAD_INPUTS = {
    "usage": ([], 2, "the following arguments are required"),
    "malformed_spec": (
        ["inspect", "helpers:echo", "f32[8,"],
        2,
        "malformed spec 'f32[8,': expected DTYPE[DIMS], e.g. f32[8,784]",
    ),
    "unknown_module": (
        ["inspect", "no_such_module_xyz:f", "f32[3]"],
        2,
        "no module named 'no_such_module_xyz'",
    ),
    "unknown_attribute": (
        ["inspect", "helpers:nope", "f32[3]"],
        2,
        "'helpers' has no attribute 'nope'",
    ),
    "error_in_function": (
        ["inspect", "helpers:fails", "f32[3]"],
        1,
        "calling helpers:fails failed: ValueError: fixture failure",
    ),
    "huge_dimension": (
        ["inspect", "helpers:echo", "f32[" + "9" * 5000 + "]"],
        2,
        "dimension 9999999999... (5,000 digits) is too large (at most 2**63 - 1)",
    ),
    "system_exit_in_function": (
        ["inspect", "helpers:quits", "f32[3]"],
        1,
        "calling helpers:quits failed: SystemExit with code 3 (rerun with --traceback",
    ),
    "bare_system_exit_in_function": (
        ["inspect", "helpers:quits_quietly", "f32[3]"],
        1,
        "calling helpers:quits_quietly failed: SystemExit with code None",
    ),
    "str_raises_in_error": (
        ["inspect", "helpers:bad_str_error", "f32[3]"],
        1,
        "calling helpers:bad_str_error failed: BadStr (its message cannot be shown: str() raised RuntimeError)",
    ),
    "control_characters_in_error": (
        ["inspect", "helpers:terminal_error", "f32[3]"],
        1,
        r"calling helpers:terminal_error failed: ValueError: \x1b[31mred\x1b[0m alert (rerun",
    ),
    "spec_too_big_for_xla": (
        ["cost", "jax.numpy:sin", "f32[4611686018427387904]"],
        2,
        "spec 'f32[4611686018427387904]' takes 18,446,744,073,709,551,616 bytes (4,611,686,018,427,387,904 elements "
        "of 4 B), more than 2**63 - 1 (XLA would abort on it): use smaller sizes",
    ),
    "spec_elements_too_many_for_xla": (
        ["inspect", "helpers:echo", "(u8[2], u8[3037000500,3037000500])"],
        2,
        "spec 'u8[3037000500,3037000500]' has 9,223,372,037,000,250,000 elements",
    ),
    "free_dimension_in_cost": (
        ["cost", "jax.numpy:matmul", "f32[b,784]", "f32[784,10]"],
        2,
        "spec 'f32[b,784]' has the symbolic dimension b, and treeshape cost compiles concrete sizes only: give sizes "
        "(f32[8,784] for b=8), or find the largest that fits with treeshape fit ... --dim b --budget 16GiB",
    ),
    "free_dimensions_in_cost": (
        ["cost", "jax.numpy:add", "x1=f32[3,1]", "x2=(f32[2*s+1,t])"],
        2,
        "spec 'x2=(f32[2*s+1,t])' has the symbolic dimensions s, t, and treeshape cost compiles concrete sizes only: "
        "give sizes (f32[17,8] for s=8, t=8), or find the largest that fits with treeshape fit ... --dim s",
    ),
    "budget_nothing_fits": (
        ["fit", "jax.numpy:matmul", "f32[b,784]", "f32[784,10]", "--dim", "b", "--budget", "1KiB"],
        2,
        "even b=1 does not fit: its peak is ",
    ),
    "negative_dimension": (
        ["fit", "jax.numpy:multiply", "f32[b-8,784]", "f32[784]", "--dim", "b", "--budget", "1MiB"],
        2,
        "at b=1, spec 'f32[b-8,784]' has a negative size ((b - 8, 784) gives (-7, 784)): the search starts at b=1: "
        "write it so that b counts from 1 (an offset such as b+7, not a difference such as b-8)",
    ),
    "max_size_too_big_for_xla": (
        ["fit", "jax.numpy:multiply", "f32[b,1099511627776,1024]", "f32[1024]", "--dim", "b", "--budget", "1MiB"],
        2,
        "at b=1048576, spec 'f32[b,1099511627776,1024]' (f32[1048576,1099511627776,1024]) has "
        "1,180,591,620,717,411,303,424 elements, more than 2**63 - 1: pass --max-size 2047 or less",
    ),
    "error_in_function_cost": (
        ["cost", "helpers:fails", "f32[3]"],
        1,
        "calling helpers:fails failed: ValueError: fixture failure",
    ),
    "error_in_function_fit": (
        ["fit", "helpers:fails", "f32[b]", "--dim", "b", "--budget", "1MiB"],
        1,
        "calling helpers:fails failed: ValueError: fixture failure",
    ),
    "abstract_axis": (
        ["inspect", "jax.nn:softmax", "f32[4,10]", "axis=i32[]"],
        1,
        "calling jax.nn:softmax failed: ConcretizationTypeError: Abstract tracer value",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_without_traceback(case):
    argv, status, message = BAD_INPUTS[case]
    result = run(*argv)
    assert result.returncode == status
    assert result.stdout == ""
    assert_one_line_error(result.stderr, message)


@pytest.mark.parametrize("spec", ["f64[3]", "i64[]", "c128[2]", "u64[1]", "float64[2]", "(f32[2], i64[])"])
def test_64_bit_spec_with_x64_off_is_an_error(spec):
    result = run("inspect", "helpers:echo", spec, JAX_ENABLE_X64="0")
    assert result.returncode == 2
    assert result.stdout == ""
    assert_one_line_error(result.stderr, "but 64-bit types are off in JAX")
    assert "set JAX_ENABLE_X64=1" in result.stderr
    assert repr(spec.split(", ")[-1].strip("()")) in result.stderr  # names the spec


def test_64_bit_spec_with_x64_on():
    result = run("inspect", "helpers:echo", "f64[3]", "i64[]", "--json", JAX_ENABLE_X64="1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        _entry("['args'][0]", [3], "float64"),
        _entry("['args'][1]", [], "int64"),
    ]


def test_literal_axis_is_concrete():
    """Before: `axis=0` was traced, and softmax raised ConcretizationTypeError (see
    BAD_INPUTS["abstract_axis"], which asks for that on purpose with `axis=i32[]`)."""
    result = run("inspect", "jax.nn:softmax", "f32[4,10]", "axis=0")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "(root)  [4,10]  f32    160 B" in result.stdout


def test_control_characters_in_the_table_are_escaped():
    result = run("inspect", "helpers:terminal_repr", "f32[2]")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "\x1b" not in result.stdout
    assert r"static TerminalRepr line one\nline two \x1b[31mred\x1b[0m" in result.stdout
    assert len(result.stdout.splitlines()) == 6  # headers, rule, 2 leaves, rule, total


def test_system_exit_while_importing_the_module(tmp_path):
    (tmp_path / "script_module.py").write_text("import sys\nsys.exit(4)\n")
    result = run("inspect", "script_module:f", "f32[3]", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert_one_line_error(result.stderr, "importing 'script_module' failed: SystemExit with code 4")


def test_error_while_importing_the_module(tmp_path):
    (tmp_path / "broken_module.py").write_text("raise RuntimeError('broken at import')\n")
    result = run("inspect", "broken_module:f", "f32[3]", cwd=tmp_path)
    assert result.returncode == 1
    assert_one_line_error(result.stderr, "importing 'broken_module' failed: RuntimeError: broken at import")


def test_traceback_option_after_the_subcommand():
    result = run("inspect", "helpers:fails", "f32[3]", "--traceback")
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert 'in fails\n    raise ValueError("fixture failure' in result.stderr
    assert result.stderr.splitlines()[-1].startswith("treeshape: error: calling")


# -- in-process: main(argv) ----------------------------------------------------------
def test_main_table(capsys):
    status = main(["inspect", "helpers:mlp", "bf16[8,784]", "scale=0.5"])
    out, err = capsys.readouterr()
    assert status == 0 and err == ""
    assert out == (
        "path        shape   dtype  bytes\n"
        "----------  ------  -----  -----\n"
        "['logits']  [8,10]  bf16   160 B\n"
        "----------  ------  -----  -----\n"
        "total: 1 leaf, 80 elements  160 B\n"
    )


def test_main_dotted_attribute_and_static_literal(capsys):
    assert main(["inspect", "helpers:Model.apply", "f32[4]", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        _entry("['n']", [], INT.name, weak_type=True),
        _entry("['y']", [4], "float32"),
    ]
    assert main(["inspect", "helpers:echo", "'relu'", "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)
    assert entry == {
        **_entry("['args'][0]", None, None, None),
        "static": "'relu'",
        "type": "builtins:str",
        "value": "relu",
    }
    assert main(["inspect", "helpers:echo", "{'w': 1.0, 'n': (1, True)}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        _entry("['args'][0]['n'][0]", [], INT.name, weak_type=True),
        _entry("['args'][0]['n'][1]", [], "bool"),
        _entry("['args'][0]['w']", [], FLOAT.name, weak_type=True),
    ]


def test_main_literals_are_concrete_also_inside_tuples(capsys):
    assert main(["inspect", "helpers:repeat", "f32[2]", "3", "axis=0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [_entry("", [6], "float32")]
    assert main(["inspect", "helpers:tile", "(f32[2], 3)", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [_entry("", [6], "float32")]
    # The same count as an abstract spec is traced, and jnp.tile refuses it.
    assert main(["inspect", "helpers:tile", "(f32[2], i32[])"]) == 1
    assert_one_line_error(capsys.readouterr().err, "calling helpers:tile failed: ")  # JAX's error, by release


def test_main_table_escapes_control_characters(capsys):
    assert main(["inspect", "helpers:terminal_repr", "f32[2]"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out == (
        "path     shape  dtype  extra                                                      bytes\n"
        "-------  -----  -----  ---------------------------------------------------------  -----\n"
        "['obj']                static TerminalRepr line one\\nline two \\x1b[31mred\\x1b[0m\n"
        "['x']    [2]    f32                                                                 8 B\n"
        "-------  -----  -----  ---------------------------------------------------------  -----\n"
        "total: 2 leaves, 2 elements                                                         8 B\n"
    )


def test_main_table_shows_a_static_value_whose_repr_raises_by_its_type(capsys):
    assert main(["inspect", "helpers:bad_repr", "f32[3]"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "['obj']                static BadRepr <BadRepr object (its repr raised)>" in out
    assert main(["inspect", "--json", "helpers:bad_repr", "f32[3]"]) == 0
    assert '"static": "<BadRepr object (its repr raised)>"' in capsys.readouterr().out


def test_main_unexpected_error_is_one_line(capsys, monkeypatch):
    import treeshape._cli._inspect

    def broken(args, stdout):
        raise RuntimeError("a bug\nwith two lines")

    monkeypatch.setattr(treeshape._cli._inspect, "run", broken)
    assert main(["inspect", "helpers:echo"]) == 1
    assert_one_line_error(capsys.readouterr().err, "unexpected error: RuntimeError: a bug (rerun with --traceback")
    assert main(["--traceback", "inspect", "helpers:echo"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.splitlines()[-1] == "treeshape: error: unexpected error: RuntimeError: a bug"


def test_main_traceback_option_before_the_subcommand(capsys):
    assert main(["--traceback", "inspect", "helpers:fails", "f32[3]"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.splitlines()[-1] == ("treeshape: error: calling helpers:fails failed: ValueError: fixture failure")


@pytest.mark.parametrize(
    "argv, status, message",
    [
        (["bogus"], 2, "invalid choice: 'bogus'"),
        (["inspect"], 2, "the following arguments are required: MODULE:ATTR"),
        (["inspect", "helpers"], 2, "expected MODULE:ATTR"),
        (["inspect", "helpers:NOT_CALLABLE"], 2, "is a int, not a callable"),
        (["inspect", "helpers:Model.nope"], 2, "'helpers:Model' has no attribute"),
        (["inspect", "helpers:echo", "f33[3]"], 2, "unknown dtype 'f33'"),
        (["inspect", "helpers:echo", "float[3]"], 2, "unknown dtype 'float'"),
        (["inspect", "helpers:echo", "f32[-1]"], 2, "malformed spec 'f32[-1]'"),
        (["inspect", "helpers:echo", "f32[8,]"], 2, "malformed spec 'f32[8,]'"),
        (["inspect", "helpers:echo", "relu"], 2, "expected DTYPE[DIMS] (e.g."),
        (["inspect", "helpers:echo", "__import__('os')"], 2, "malformed spec"),
        (["inspect", "helpers:echo", "x=1", "f32[3]"], 2, "after a keyword spec"),
        (["inspect", "helpers:echo", "x=1", "x=2"], 2, "keyword 'x' given twice"),
        (["inspect", "helpers:echo", "--jsn"], 2, "unrecognized arguments: --jsn"),
        (["demo", "extra"], 2, "unrecognized arguments: extra"),
        (["inspect", "jax.numpy:matmul", "f32[3]", "f32[4]"], 1, "TypeError: dot_general"),
        (["inspect", "helpers:echo", TOO_BIG], 1, "OverflowError"),
        (["inspect", "helpers:echo", "f32[9223372036854775808]"], 2, "dimension 9223372036854775808 is too large"),
        (["inspect", "helpers:echo", "~bool[]"], 2, "'~' (weak type) applies to numeric dtypes only"),
        (["inspect", "helpers:echo", "~0.5"], 2, "'~' marks a weak array spec, e.g. ~f32[]"),
        (["inspect", "helpers:echo", "~key<fry>[]"], 2, "a PRNG key has no weak type"),
        (["inspect", "helpers:echo", "key<bogus>[2]"], 2, "unknown PRNG implementation 'bogus'"),
        (["inspect", "helpers:echo", "key<fry>[-1]"], 2, "malformed spec 'key<fry>[-1]'"),
        (
            ["inspect", "helpers:echo", "(f32[2]"],
            2,
            "malformed spec '(f32[2]': expected ',' or ')', found the end",
        ),
        (["inspect", "helpers:echo", "(f32[2],,)"], 2, "an empty item at position 8"),
        (["inspect", "helpers:echo", "(f32[2]) x"], 2, "unexpected 'x' after the closing bracket"),
        (["inspect", "helpers:echo", "(f33[2], 1)"], 2, "unknown dtype 'f33' in spec 'f33[2]'"),
        (["inspect", "helpers:echo", "(f32[2], relu)"], 2, "(an item of '(f32[2], relu)')"),
        (["inspect", "helpers:echo", "(" * 101 + "f32[2]" + ")" * 101], 2, "nest more than 100 deep"),
        (["inspect", "helpers:echo", "--j\x1bson"], 2, r"unrecognized arguments: --j\x1bson"),
    ],
)
def test_main_bad_input(capsys, argv, status, message):
    assert main(argv) == status
    out, err = capsys.readouterr()
    assert out == ""
    assert_one_line_error(err, message)


def test_main_help_documents_the_spec_language(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for text in ("f32[8,784]", "bf16[]", "u8[2,2]", "float32", "0.5", "True", "NAME=SPEC"):
        assert text in out
    assert "treeshape inspect mypkg.model:predict 'f32[8,784]'" in out
    for text in ("~f32[]", "key<fry>[2]", "(f32[2],i32[])", "axis=0", "JAX_ENABLE_X64=1"):
        assert text in out
    assert main(["inspect", "--help"]) == 0
    assert "DTYPE[DIMS]" in capsys.readouterr().out


# -- cost and fit: --json, progress ------------------------------------------------------
def _sds(shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def test_cost_json_is_the_costs_fields(capsys):
    import treeshape as ts

    assert main(["cost", "jax.numpy:matmul", "f32[8,784]", "f32[784,10]", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and len(out.splitlines()) == 1
    cost = ts.cost(jnp.matmul, _sds((8, 784)), _sds((784, 10)))
    expected = {k: v for k, v in dataclasses.asdict(cost).items() if k != "timeline"}  # `--timeline` adds it
    assert json.loads(out) == json.loads(json.dumps(expected, default=str))  # dtypes by name
    assert json.loads(out)["peak_bytes"] == (8 * 784 + 784 * 10 + 8 * 10) * 4
    assert list(json.loads(out)) == [f.name for f in dataclasses.fields(cost) if f.name != "timeline"]  # in order


def test_fit_json_nests_the_cost(capsys):
    import treeshape as ts

    (b,) = jax.export.symbolic_shape("b")
    argv = ["fit", "jax.numpy:matmul", "f32[b,784]", "f32[784,10]", "--dim", "b", "--budget", "1MiB", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == "" and len(out.splitlines()) == 1
    fit = ts.largest_fit(jnp.matmul, _sds((b, 784)), _sds((784, 10)), dim="b", budget=2**20)
    data = json.loads(out)
    expected = json.loads(json.dumps(dataclasses.asdict(fit), default=str))  # dtypes by name
    del expected["cost"]["timeline"]  # `cost --timeline` adds it
    assert data == {**expected, "compiles": data["compiles"]}  # asked again: from the cache
    assert data["cost"]["peak_bytes"] <= 2**20 and (data["monotone"], data["capped"]) == (True, False)


@dataclasses.dataclass(frozen=True)
class _Buffer:
    shape: tuple
    nbytes: int


@dataclasses.dataclass(frozen=True)
class _FutureCost:
    flops: float
    exact_flops: bool
    buffers: tuple
    note: object


def test_json_writes_fields_added_later(capsys, monkeypatch):
    """A field that is not JSON data itself (a tuple of dataclasses, a float JSON has no
    number for, another object) is written as data all the same."""
    import treeshape as ts

    future = _FutureCost(float("nan"), False, (_Buffer((8, 10), 320), _Buffer((), 4)), jnp.dtype("float32"))
    monkeypatch.setattr(ts, "cost", lambda fn, *args, **kwargs: future)
    assert main(["cost", "jax.numpy:matmul", "f32[8,784]", "f32[784,10]", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "flops": "nan",
        "exact_flops": False,
        "buffers": [{"shape": [8, 10], "nbytes": 320}, {"shape": [], "nbytes": 4}],
        "note": "float32",
    }


FIT = ["fit", "jax.numpy:matmul", "f32[b,784]", "f32[784,10]", "--dim", "b", "--budget", "1MiB"]


def test_fit_progress_goes_to_stderr():
    quiet = run(*FIT)  # stderr is a pipe, not a terminal: no progress
    assert quiet.returncode == 0 and quiet.stderr == ""
    shown = run(*FIT, "--progress", "--json")
    assert shown.returncode == 0
    lines = shown.stderr.splitlines()
    compiles = json.loads(shown.stdout)["compiles"]
    assert len(lines) == 2 * compiles + 1  # a line as each compile starts, one as it ends, the summary
    assert all(line.startswith("treeshape.largest_fit: b=") for line in lines)
    assert lines[0] == "treeshape.largest_fit: b=1: compiling"
    assert lines[1].startswith("treeshape.largest_fit: b=1: peak ")
    assert " fits (peak " in lines[-1] and f"; {compiles} programs compiled in " in lines[-1]
    assert json.loads(shown.stdout)["size"] == json.loads(run(*FIT, "--json").stdout)["size"]


@pytest.mark.parametrize("option, shown", [([], True), (["--no-progress"], False), (["--progress"], True)])
def test_fit_progress_by_default_on_a_terminal(capsys, monkeypatch, option, shown):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main([*FIT, *option]) == 0
    err = capsys.readouterr().err
    assert ("treeshape.largest_fit: b=" in err) is shown
    assert (err == "") is not shown


def test_main_version(capsys):
    import treeshape

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"treeshape {treeshape.__version__}\n"


def test_plan_max_seconds_bounds_a_steps_time_in_the_table_and_json(capsys, tmp_path, monkeypatch):
    """`treeshape plan --max-seconds S` is `ts.plan(max_seconds=S)`: the row's size the fastest
    whose step takes at most S (16 of a step 1.0 ms at b=64 and 0.63 ms at b=32 on a v5e),
    the bound over the table and in the JSON; a bound that is no positive number is exit 2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "streamed.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "(b,) = jax.export.symbolic_shape('b')\n"
        "def make(width):\n"
        "    return (lambda x: jnp.sin(x) * 2), jax.ShapeDtypeStruct((b, width), jnp.float32)\n"
    )
    argv = ["plan", "streamed:make", "--choice", "width=1048576", "--target", "v5e", "--max-size", "32"]
    argv += ["--donate", "0"]
    assert main([*argv, "--max-seconds", "0.0005", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_seconds"] == 0.0005 and [(r["size"], r["largest"]) for r in data["rows"]] == [(16, 32)]
    assert data["rows"][0]["seconds"] <= 0.0005
    assert main([*argv, "--max-seconds", "0.0005"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "max_seconds=0.0005: each row's b the fastest whose step takes at most 500.0 us"
    assert table[3].split()[:4] == ["best", "1048576", "16", "32"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_seconds"] is None
    for bad in ("0", "-1", "inf", "nan"):
        assert main([*argv, "--max-seconds", bad]) == 2
        assert "--max-seconds must be a positive number of seconds (e.g. 0.02 for 20 ms)" in capsys.readouterr().err
