"""The docs cover the public API: every name in `treeshape.__all__` has a
`::: treeshape.NAME` line in docs/api/*.md (optax's coverage check) and a
docstring of at most 50 lines with an example, and every page in mkdocs.yml's nav
exists, and the examples of the caching guide and of the
sharding guide's first section run and print what their comments say, and so do
the framework models of the structures guide, the fit guide's sections (the train
step, the planned state, the search, the peak, loops) and the commands the guides show;
every python block of every guide runs, in order (fit.md with a smaller model); and the
README says how many tests there are. `mkdocs build --strict` checks the rest."""

import functools
import pathlib
import re
import warnings
from typing import Final

import jax
import pytest

import treeshape as ts


ROOT = pathlib.Path(__file__).parents[1]


def test_every_public_name_has_an_api_entry():
    text = "\n".join(path.read_text() for path in sorted((ROOT / "docs" / "api").glob("*.md")))
    documented = re.findall(r"^::: treeshape\.(\w+)\s*$", text, flags=re.MULTILINE)
    assert sorted(documented) == sorted(ts.__all__)


# A public docstring is a contract (what, arguments, returns, raises, one example); what it
# would explain beyond that lives in the guide it links.
_DOCSTRING_LINES: Final = 50


@pytest.mark.parametrize("name", ts.__all__)
def test_every_public_docstring_is_contract_sized_with_an_example(name):
    doc = getattr(ts, name).__doc__ or ""
    assert len(doc.splitlines()) <= _DOCSTRING_LINES, (name, len(doc.splitlines()))
    assert ">>> " in doc, name


def test_the_readme_states_the_number_of_tests(request):
    """The README's "about N tests" is within 10% of what a run of the whole suite collects
    (`pytest` with no arguments, as CI runs it, deselected tests counted): a run of some
    files cannot tell how many the suite has."""
    stated = re.search(r"The whole test suite \(about ([\d,]+) tests,", (ROOT / "README.md").read_text())
    assert stated, "README.md no longer says how many tests the suite has"
    config = request.config
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or config.option.ignore or config.option.ignore_glob:
        pytest.skip("the suite's size is known in a run of the whole suite (pytest with no arguments)")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    deselected = len(reporter.stats.get("deselected", [])) if reporter else 0
    collected = len(request.session.items) + deselected
    n = int(stated.group(1).replace(",", ""))
    assert abs(collected - n) <= n / 10, f"README.md says about {n:,} tests; the suite has {collected:,}"


def test_every_nav_page_exists():
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    pages = re.findall(r"([\w/-]+\.(?:md|ipynb))", nav)
    assert pages
    for page in pages:
        where = ROOT / ("" if page.startswith("notebooks/") else "docs") / page
        assert where.exists(), page


# -- the guides' examples run, and print what their comments say -------------------
_BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", flags=re.DOTALL | re.MULTILINE)
# `print(X)  # EXPECTED`, where EXPECTED is a whole value (a shape, a CacheInfo, a
# sharding with `...` for the parts left out), ended by the line or by ": why".
_SHOWN = re.compile(
    r"^(?P<indent> *)print\((?P<expr>.*)\)  # (?P<shown>(?:CacheInfo|\w*Sharding)\(.*\)|\([\d, ]*\))(?::.*)?$"
)


def _examples(page, before=None):
    """The code of `page`'s python blocks (up to the heading `before`; not the
    sketches, which elide code with a `...` line), each `print(X)  # EXPECTED`
    line made into a check that it prints EXPECTED."""
    text = (ROOT / "docs" / page).read_text()
    if before is not None:
        text = text.split(before, 1)[0]
    code = []
    for indent, block in _BLOCK.findall(text):
        lines = [line[len(indent) :] for line in block.splitlines()]
        if any(line.strip() == "..." for line in lines):
            continue
        check = lambda m: f"{m['indent']}_shows({m['expr']}, {m['shown']!r})"
        code.append("\n".join(_SHOWN.sub(check, line) for line in lines))
    return code


def _shows(value, shown):
    pattern = ".*".join(re.escape(part) for part in shown.split("..."))
    text = str(value).replace("PartitionSpec(", "P(")  # JAX's own repr of a spec before jax 0.9.1
    assert re.fullmatch(pattern, text), (text, shown)


def _run(code):
    namespace = {"_shows": _shows}
    for block in code:
        exec(compile(block, "<docs example>", "exec"), namespace)


def test_the_caching_guide_runs_and_prints_what_it_says():
    code = _examples("guide/caching.md")
    assert sum(block.count("_shows(") for block in code) >= 8
    with jax.enable_x64(False):  # the guide's outputs are those of JAX's default
        _run(code)
    ts.clear_cache()


def test_the_sharding_guides_optimizer_state_examples_run_and_print_what_they_say():
    code = _examples("guide/sharding.md", before="### Which mesh a leaf lands on")
    assert sum(block.count("_shows(") for block in code) >= 3  # the Auto-axes check and its fix
    with jax.enable_x64(False):  # the guide's outputs are those of JAX's default
        _run(code)


# -- a guide whose python blocks are each followed by what they print --------------------
_FENCED = re.compile(r"^```(\w+)\n(.*?)^```\n", flags=re.DOTALL | re.MULTILINE)


def _blocks_with_output(page):
    """`(code, printed)` for each python block of `page`, `printed` the text block right
    after it (None when prose comes first)."""
    text = (ROOT / "docs" / page).read_text()
    found = [(m.group(1), m.group(2), m.start(), m.end()) for m in _FENCED.finditer(text)]
    out = []
    for k, (lang, body, _, end) in enumerate(found):
        if lang != "python":
            continue
        after = found[k + 1] if k + 1 < len(found) else None
        shown = after[1] if after and after[0] == "text" and not text[end : after[2]].strip() else None
        out.append((body, shown))
    return out


def test_the_symbolic_dimensions_guide_prints_what_it_shows(capsys):
    blocks = _blocks_with_output("guide/symbolic.md")
    assert sum(shown is not None for _, shown in blocks) >= 7
    namespace = {}
    with jax.enable_x64(False):  # the guide's outputs are those of JAX's default
        for code, shown in blocks:
            exec(compile(code, "<docs example>", "exec"), namespace)
            printed = capsys.readouterr().out
            if shown is not None:
                assert printed == shown, code
    ts.clear_cache()


def test_every_public_example_is_run_by_the_doctests():
    """A public class reports module `treeshape`, which doctest would take for another
    module's: its examples run only through its module's `__test__`. Every module of the
    package is read, the cost wing's rooms included, as pytest's --doctest-modules reads them."""
    import doctest
    import importlib
    import pkgutil

    found = set()
    for module_info in pkgutil.walk_packages(ts.__path__, "treeshape."):
        if module_info.name.endswith("__main__"):
            continue
        module = importlib.import_module(module_info.name)
        found |= {test.name.rsplit(".", 1)[-1] for test in doctest.DocTestFinder().find(module) if test.examples}
    missed = [
        name
        for name in ts.__all__
        if ">>>" in (getattr(getattr(ts, name), "__doc__", None) or "") and name not in found
    ]
    assert missed == []


# A python block followed by a text block: what the code prints.
_PRINTS = re.compile(r"^```python\n(.*?)^```\n\n```text\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)


def _section_pairs(page: str, heading: str, count: int) -> list[tuple[str, str]]:
    """The (code, what it prints) pairs of one section of a guide, `count` of them."""
    text = (ROOT / "docs" / "guide" / page).read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    pairs = _PRINTS.findall(section)
    assert len(pairs) == count
    return pairs


def _prints_what_it_shows(pairs: list[tuple[str, str]], capsys) -> None:
    _prints_what_it_shows_in(pairs, {}, capsys)


def _prints_what_it_shows_in(pairs: list[tuple[str, str]], namespace: dict, capsys) -> None:
    with jax.enable_x64(False):  # the guide's outputs are those of JAX's default
        for code, shown in pairs:
            exec(compile(code, "<docs example>", "exec"), namespace)
            assert capsys.readouterr().out == shown, code
    ts.clear_cache()


def test_the_structures_guides_framework_models_run_and_print_what_they_show(capsys):
    _prints_what_it_shows(_section_pairs("structures.md", "Framework models: flax, equinox, optax", 6), capsys)


# -- the fit guide's search examples and the cost / fit commands shown in the guides ------------
_SECONDS = re.compile(r"\d+\.\d+ s$", flags=re.MULTILINE)
_FIGURES = re.compile(r"[\d,.]*\d")


def _same_xla_as_the_guides():
    """Whether this XLA gives the figure the fit guide shows for its layer at b=1 (68,096 B).
    The guides' figures are those of the XLA they were written with; another (the floor
    release's) lays out and pads buffers differently, so its figures, and the sizes its
    searches try, differ."""
    import jax.numpy as jnp

    w, x = jax.ShapeDtypeStruct((256, 64), jnp.float32), jax.ShapeDtypeStruct((1, 256), jnp.float32)
    return ts.cost(lambda w, x: jnp.tanh(x @ w), w, x).peak_bytes == 68_096


def _assert_shows(got, shown, exact, what):
    """`got` is what the guide shows (seconds aside); with another XLA, its first and last
    lines are, figures aside."""
    got, shown = _SECONDS.sub("... s", got), _SECONDS.sub("... s", shown)
    if exact:
        assert got == shown, what
    else:
        # a timeline chart's row of several steps (`3-4`) may be one step (`8`) there
        masked = lambda line: " ".join(_FIGURES.sub("#", line).replace("#-#", "#").split())  # noqa: E731
        ends = lambda text: [masked(line) for line in (text.splitlines()[0], text.splitlines()[-1])]  # noqa: E731
        assert ends(got) == ends(shown), what


def test_the_fit_guides_search_examples_print_what_they_show(capsys):
    """The python blocks of the section on the search, each followed by what it prints
    (the progress lines on stderr)."""
    import jax.numpy as jnp

    exact = _same_xla_as_the_guides()
    page = (ROOT / "docs" / "guide" / "fit.md").read_text()
    section = page.split("\nWhen the peak does not grow in a line", 1)[1].split("\n## ", 1)[0]
    pairs = _PRINTS.findall(section)
    assert len(pairs) == 2
    namespace = {"jax": jax, "jnp": jnp, "ts": ts}
    ts.clear_cache()
    with jax.enable_x64(False):  # the guide's outputs are those of JAX's default
        for code, shown in pairs:
            exec(compile(code, "<docs example>", "exec"), namespace)
            out, err = capsys.readouterr()
            _assert_shows(out + err, shown, exact, code)
    ts.clear_cache()


_CONSOLE = re.compile(
    r"^```console\n\$ treeshape ((?:inspect|cost|fit) [^\n]*)\n(.*?)^```", flags=re.DOTALL | re.MULTILINE
)
# Commands shown that a test process cannot run as written, with why: kept small.
_CONSOLE_NOT_RUNNABLE: Final = {
    "inspect mypkg.model:init_state 'bf16[4]' step=0 --json": "the reader's own package",
}


def _console_commands(page: str) -> list[tuple[str, str]]:
    """(command, what it prints) of each console block of a guide page, but those of
    `_CONSOLE_NOT_RUNNABLE` and those that show what an old release printed (after a
    paragraph that starts with **Before**)."""
    text = (ROOT / "docs" / "guide" / page).read_text()
    before = lambda m: text[: m.start()].rstrip().split("\n\n")[-1].startswith("**Before**")  # noqa: E731
    return [(m[1], m[2]) for m in _CONSOLE.finditer(text) if m[1] not in _CONSOLE_NOT_RUNNABLE and not before(m)]


def test_the_commands_in_the_guides_print_what_they_show(capsys):
    import shlex

    from treeshape._cli import main

    exact = _same_xla_as_the_guides()
    shown = [command for page in ("cli.md", "fit.md") for command in _console_commands(page)]
    assert len(shown) >= 12
    with jax.enable_x64(False):
        for command, output in shown:
            ts.clear_cache()
            status = main(shlex.split(command))
            out, err = capsys.readouterr()
            _assert_shows(out or err, output, exact, command)
            assert status == ((1 if "failed:" in err else 2) if err else 0), command
    ts.clear_cache()


def test_the_console_blocks_left_out_are_there():
    text = (ROOT / "docs" / "guide" / "cli.md").read_text()
    for command in _CONSOLE_NOT_RUNNABLE:
        assert f"$ treeshape {command}\n" in text, command
    before = 1  # the error treeshape 0.1 gave, shown **Before** its fix
    assert len(_CONSOLE.findall(text)) == len(_console_commands("cli.md")) + len(_CONSOLE_NOT_RUNNABLE) + before


def test_the_retraces_guide_prints_what_it_shows(capsys):
    blocks = _blocks_with_output("guide/retraces.md")
    assert sum(shown is not None for _, shown in blocks) >= 6
    namespace: dict = {}
    with jax.enable_x64(False):  # the guide's outputs are those of JAX's default
        for code, shown in blocks:
            exec(compile(code, "<docs example>", "exec"), namespace)
            printed = capsys.readouterr().out
            if shown is not None:
                assert printed == shown, code


def test_the_fit_guides_peak_section_runs_and_prints_what_it_shows(capsys):
    """The buffers, ops and peaks it shows; its breakdown tables are jax 0.10.2's (the
    floor's XLA makes one more small buffer of its own and no output at that step)."""
    page = (ROOT / "docs" / "guide" / "fit.md").read_text()
    section = page.split("\n## What is at the peak", 1)[1].split("\n## ", 1)[0]
    pairs = _PRINTS.findall(section)
    assert len(pairs) == 3
    namespace: dict = {}
    with jax.enable_x64(False):  # the guide's outputs are those of JAX's default
        for code, shown in pairs:
            exec(compile(code, "<docs example>", "exec"), namespace)
            printed = capsys.readouterr().out
            if "breakdown" not in code or jax.__version__ == "0.10.2":
                assert printed == shown, code
            else:
                assert printed.splitlines()[2] == shown.splitlines()[2], code  # the largest group
    ts.clear_cache()


def test_the_fit_guides_loops_section_prints_what_it_shows(capsys):
    _prints_what_it_shows(_section_pairs("fit.md", "Loops", 2), capsys)


def test_the_fit_guides_cost_section_prints_what_it_shows(capsys):
    _prints_what_it_shows(_section_pairs("fit.md", "What `ts.cost` compiles", 1), capsys)


def test_the_fit_guides_train_step_prints_what_it_shows(capsys):
    _prints_what_it_shows(_section_pairs("fit.md", "A train step as you run it", 3), capsys)


def test_the_fit_guides_planned_state_prints_what_it_shows(capsys):
    """The 124M model's state and batch on 8 devices (abstract evaluation only, no compile)."""
    page = (ROOT / "docs" / "guide" / "fit.md").read_text()
    model = page.split("\n## A 124M-parameter model with AdamW\n", 1)[1].split("\n## ", 1)[0]
    (code,) = [block for _, block in _BLOCK.findall(model)]
    namespace: dict = {}
    exec(compile(code, "<docs example>", "exec"), namespace)
    pairs = _section_pairs("fit.md", "Its state and a batch, planned on 8 devices", 1)
    _prints_what_it_shows_in(pairs, namespace, capsys)


# -- every python block of a guide runs as written, in order -------------------------------
# Pages whose python blocks run whole, each page in one namespace (fit.md: its own test below).
_WHOLE_PAGES: Final = (
    "index.md",
    "getting-started.md",
    "guide/caching.md",
    "guide/carries.md",
    "guide/cli.md",
    "guide/residuals.md",
    "guide/retraces.md",
    "guide/settle.md",
    "guide/sharding.md",
    "guide/structures.md",
    "guide/symbolic.md",
    "guide/testing.md",
    "guide/time.md",
    "guide/weak-types.md",
)
# Blocks that need what a test process lacks, by page and a line of theirs: kept small.
_NOT_RUNNABLE: Final = {
    ("guide/sharding.md", "jax.distributed.initialize()"): "several processes of a cluster",
    ("guide/sharding.md", 'jax.config.update("jax_num_cpu_devices", 2)'): "a process of its own per host",
    ("guide/memory.md", "def make_lm(remat):"): "fifteen compiles of an 8-layer model, eight minutes on two cores",
}


def _python_blocks(page: str) -> list[str]:
    """The code of each python block of `page`, in order (a `>>>` session as its code), but
    the blocks of `_NOT_RUNNABLE`."""
    text = (ROOT / "docs" / page).read_text()
    out = []
    for indent, block in _BLOCK.findall(text):
        lines = [line[len(indent) :] for line in block.splitlines()]
        if lines and lines[0].startswith(">>> "):
            lines = [line[4:] for line in lines if line.startswith((">>> ", "... "))]
        code = "\n".join(lines)
        if not any(p == page and line in code for p, line in _NOT_RUNNABLE):
            out.append(code)
    return out


def test_the_not_runnable_blocks_are_there():
    for page, line in _NOT_RUNNABLE:
        assert line in (ROOT / "docs" / page).read_text(), (page, line)


@pytest.mark.parametrize("page", _WHOLE_PAGES)
def test_every_python_block_of_the_guide_runs_as_written_in_order(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a guide may write files (cli.md's state.json)
    blocks = _python_blocks(page)
    assert blocks
    namespace: dict = {"__name__": "__docs__"}
    with jax.enable_x64(False), warnings.catch_warnings():
        warnings.simplefilter("ignore", ts.PrecisionWarning)  # carries.md shows one on purpose
        for i, code in enumerate(blocks):
            exec(compile(code, f"<{page} block {i}>", "exec"), namespace)
    capsys.readouterr()
    ts.clear_cache()


# fit.md as written compiles its 124M-parameter model's step for well over ten minutes on two
# cores: for 8 devices, 64 and 512 simulated ones, 64 H100s and 64 and 256 v5e chips, at every
# size its searches try. Here the model is this small one (sizes every plan of the page divides),
# and a search stops at the size it compiles first (`max_size=1`, where the page gives none):
# each block runs as written, every kind of compile included (libtpu and XLA:GPU for `target=`,
# which the `test` extra installs).
_FIT_SMALL_MODEL: Final = {"vocab": 512, "d_model": 256, "layers": 1, "heads": 4, "kv_heads": 2, "d_ff": 256}
_CONFIG = re.compile(r"^CONFIG = \{\n.*?^\}\n", flags=re.DOTALL | re.MULTILINE)


def test_every_python_block_of_the_fit_guide_runs_as_written_in_order(monkeypatch, capsys):
    """All of fit.md but its opening sketch (`...` for the step the page builds), in one
    namespace: about 50 s. The 124M model's figures printed are not compared (the model is
    smaller); the sections that print figures of their own are compared by the tests above."""
    blocks = _python_blocks("guide/fit.md")
    sketch = [code for code in blocks if any(line.strip() == "..." for line in code.splitlines())]
    assert len(sketch) == 1 and len(blocks) > 20
    assert sum(len(_CONFIG.findall(code)) for code in blocks) == 1
    small = f"CONFIG = {_FIT_SMALL_MODEL!r}\n"
    nvidia = tuple(int(part) for part in jax.__version__.split(".")[:2]) >= (0, 10)  # NVIDIA targets
    monkeypatch.setattr(ts, "largest_fit", functools.partial(ts.largest_fit, max_size=1))
    namespace: dict = {"__name__": "__docs__"}
    with jax.enable_x64(False):
        for i, code in enumerate(blocks):
            if code in sketch:
                continue
            compiled = compile(_CONFIG.sub(small, code), f"<guide/fit.md block {i}>", "exec")
            if '"h100"' in code and not nvidia:
                with pytest.raises(ts.JaxReleaseError, match="0.10.0"):  # names the release that brings them
                    exec(compiled, namespace)
            else:
                exec(compiled, namespace)
    printed = capsys.readouterr().out
    assert not nvidia or "H100 x64 (deviceless)" in printed and "TPU v5e x64 (deviceless)" in printed
    ts.clear_cache()


def test_the_plan_guides_examples_print_the_tables_it_shows(capsys):
    """plan.md's python blocks as written, in order, in one namespace, each followed by the
    text block it prints: the plan of one v5e, and the layouts of 8 devices on a v5e 2x4 and
    on 8 H100s (every combination compiled by its target's compiler at a few sizes). With
    another XLA than the guide's (the floor release's), or a JAX without NVIDIA targets, the
    tables' shape: their headers and their rows' choices in the same order."""
    pairs = _PRINTS.findall((ROOT / "docs" / "guide" / "plan.md").read_text())
    assert len(pairs) == 2 and all("best" in shown for _, shown in pairs)
    exact = _same_xla_as_the_guides() and _NEW_ENOUGH_FOR_CUDA
    namespace: dict = {"__name__": "__docs__"}
    with jax.enable_x64(False):
        for i, (code, shown) in enumerate(pairs):
            if not _NEW_ENOUGH_FOR_CUDA:  # jax 0.8.0: NVIDIA targets are a JaxReleaseError
                code = code.replace('("v5e:2x4", "h100")', '("v5e:2x4",)')
            exec(compile(code, f"<guide/plan.md block {i}>", "exec"), namespace)
            printed = capsys.readouterr().out
            if exact:
                assert printed == shown, printed
            else:
                rows = lambda text: [line.split()[:2] for line in text.splitlines() if line.strip()]  # noqa: E731
                assert rows(printed) == rows(shown)[: len(rows(printed))], printed
    ts.clear_cache()


# -- the command line's page documents the options that exist -------------------------------
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
_AS_FOR = re.compile(r"((?:`--[a-z-]+[^`]*`(?:, | and |,? and )?)+) (?:is|are) as for `(\w+)`")


def _subcommand_options():
    """Each subcommand's options, as its argparse parser declares them (the main parser's
    own, `--help` and `--version`, under `None`)."""
    import argparse

    from treeshape._cli._parser import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    options = {name: set(p._option_string_actions) for name, p in sub.choices.items()}
    options[None] = set(parser._option_string_actions)
    return options


def _documented_options(text):
    """`(subcommand, option, line)` for each `--option` of the page: a line that names
    `treeshape SUBCOMMAND` (or, in a list, "; for `SUBCOMMAND`,") gives its options after
    that to it, else the section's (a heading "## `treeshape SUBCOMMAND`") has them, or the
    main parser where the section names none; a list of options "as for `fit`" is given to
    `fit` as well."""
    found = []
    command = None
    for line in text.splitlines():
        heading = re.match(r"## `treeshape ([\w-]+)`", line)
        if line.startswith("## "):
            command = heading[1] if heading else None
        named = list(re.finditer(r"\btreeshape ([a-z][\w-]*)|(?<=; )for `([a-z][\w-]*)`,", line))
        start, owner = 0, command
        for m in named:
            found += [(owner, option, line) for option in _OPTION.findall(line[start : m.start()])]
            start, owner = m.end(), m[1] or m[2]
        found += [(owner, option, line) for option in _OPTION.findall(line[start:])]
        for listed, other in _AS_FOR.findall(line):
            found += [(other, option, line) for option in _OPTION.findall(listed)]
    return found


def test_the_command_lines_page_documents_only_options_that_exist():
    """Each `--option` the page gives a subcommand is one its parser declares: the page
    once gave `treeshape fit` a `--donate` (as `plan` has it) that fit does not take."""
    options = _subcommand_options()
    documented = _documented_options((ROOT / "docs" / "guide" / "cli.md").read_text())
    assert len({(c, o) for c, o, _ in documented}) >= 25
    missing = [
        (command, option, line)
        for command, option, line in documented
        if option not in options.get(command, set()) | options[None]
    ]
    assert missing == []
    assert {("plan", "--donate"), ("fit", "--dim"), ("cost", "--timeline")} <= {(c, o) for c, o, _ in documented}


def test_the_option_check_finds_an_option_given_to_a_subcommand_that_lacks_it():
    page = (
        "## `treeshape plan`\n\n`--budget` and `--donate I` are as for `fit`.\n\n```sh\ntreeshape cost m:f --dim b\n"
        "```\n\n## Errors\n\n| 2 | usage, `--help`; for `inspect`, `--depth` |"
    )
    documented = {(c, o) for c, o, _ in _documented_options(page)}
    assert documented == {("plan", "--budget"), ("plan", "--donate"), ("fit", "--budget"), ("fit", "--donate"),
                          ("cost", "--dim"), (None, "--help"), ("inspect", "--depth")}  # fmt: skip
    options = _subcommand_options()
    assert "--donate" in options["plan"] and "--donate" not in options["fit"] and "--dim" not in options["cost"]


_NEW_ENOUGH_FOR_CUDA: Final = tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10)


# -- "Memory beyond the chip": its examples, and its chip table as measured ----------------------
_MEMORY_PAGE: Final = ROOT / "docs" / "guide" / "memory.md"
_POLICIES_MEASURED: Final = ROOT / "benchmarks" / "steptime" / "measured" / "policies-m-2026-12-07.json"


def test_the_memory_guides_examples_print_what_it_shows(capsys):
    """memory.md's python blocks in order, in one namespace, each compared with the text
    block it prints (with another XLA than the guide's, the floor release's, only run);
    the block of `_NOT_RUNNABLE` is left out."""
    fenced = re.findall(r"^```(\w+)\n(.*?)^```\n", _MEMORY_PAGE.read_text(), flags=re.DOTALL | re.MULTILINE)
    pairs = zip(fenced, fenced[1:], strict=False)
    shown_after = {code: out for (lang, code), (then, out) in pairs if (lang, then) == ("python", "text")}
    blocks = _python_blocks("guide/memory.md")
    assert len(blocks) == 4 and sum(code + "\n" in shown_after for code in blocks) == 3  # the model's prints nothing
    exact = _same_xla_as_the_guides()
    namespace: dict = {"__name__": "__docs__"}
    with jax.enable_x64(False):
        for i, code in enumerate(blocks):
            exec(compile(code, f"<guide/memory.md block {i}>", "exec"), namespace)
            printed = capsys.readouterr().out
            shown = shown_after.get(code + "\n")
            if exact and shown is not None:
                assert printed == shown, code
    ts.clear_cache()


def test_the_memory_guides_chip_table_is_the_committed_measurement():
    """Each row of the page's table of the three policies on a v5e: the chip's median, the
    model's `seconds` as committed and their ratio, libtpu's peak and the host's
    temporaries, as the committed summary holds them."""
    import json

    summary = json.loads(_POLICIES_MEASURED.read_text())
    text = _MEMORY_PAGE.read_text()
    section = text.split("\n## On a real v5e\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if re.match(r"\| (dots|offload|full) \|", line)]
    expected = []
    for r in summary["rows"]:
        measured, model = r["median_back_to_back_s"], r["model_as_committed"]
        host = model["host_temp_bytes"]
        expected.append(
            [
                r["name"].removeprefix("policy-"),
                str(r["size"]),
                f"{measured * 1e3:.1f} ms",
                f"{model['seconds'] * 1e3:.1f} ms",
                f"{model['seconds'] / measured:.2f}",
                f"{r['memory']['peak_memory_in_bytes'] / 2**30:.2f} GiB",
                f"{host / 2**30:.1f} GiB" if host else "0",
            ]
        )
    assert [[cell.strip() for cell in row] for row in rows] == expected
    ratios = [r["model_as_committed"]["seconds"] / r["median_back_to_back_s"] for r in summary["rows"]]
    assert all(0.8 <= ratio <= 1.2 for ratio in ratios)  # section 32: each within 20%
    for size in (8, 16):  # and the chip's order at each size
        at = [r for r in summary["rows"] if r["size"] == size]
        by_chip = sorted(at, key=lambda r: r["median_back_to_back_s"])
        assert by_chip == sorted(at, key=lambda r: r["model_as_committed"]["seconds"])


# -- "Serving: how many sequences, how fast": its plans of a decode step -------------------------
def test_the_serving_guides_examples_print_what_it_shows(capsys):
    """serving.md's python blocks in order, in one namespace, each compared with the text
    block it prints (with another XLA than the guide's, the floor release's, only run): a
    decode step planned over cache lengths on a v5e, without and within `max_seconds`, a
    bound no size meets, and the KV cache's bytes by path at the peak (27 compiles)."""
    blocks = _blocks_with_output("guide/serving.md")
    assert len(blocks) == 5 and [shown is not None for _, shown in blocks] == [False, True, True, True, True]
    exact = _same_xla_as_the_guides()
    namespace: dict = {"__name__": "__docs__"}
    with jax.enable_x64(False):
        for i, (code, shown) in enumerate(blocks):
            exec(compile(code, f"<guide/serving.md block {i}>", "exec"), namespace)
            printed = capsys.readouterr().out
            if exact and shown is not None:
                assert printed == shown, code
    assert namespace["plan"].compiles == 0 and namespace["plan"].max_seconds == 0.00075
    ts.clear_cache()
