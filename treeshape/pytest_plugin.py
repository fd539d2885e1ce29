"""treeshape's pytest plugin: Structure diffs in assertions, and structure snapshots.

Installed with treeshape (entry point `pytest11`), so it is active in every
pytest run once treeshape is installed:

- `assert s1 == s2` on two [treeshape.Structure][]s shows their differences
  by path ([treeshape.Structure.diff][]) in pytest's assertion report;
- the fixture `structure_snapshot` checks a tree against a JSON snapshot
  next to the test, `__structures__/<test name>.json`:
  `structure_snapshot.check(tree)`. Run `pytest --update-structures` to
  write the snapshots, or rewrite them after an intended change.

pytest loads entry-point plugins before any `conftest.py`, and a conftest
must still be able to configure JAX (`JAX_PLATFORMS`, `JAX_ENABLE_X64`,
`XLA_FLAGS`) before JAX is imported. So this module imports only pytest and
the standard library; JAX and treeshape are imported when the fixture is used
(and the assertion hook looks at treeshape only if it is already imported).
"""

import hashlib
import pathlib
import re
import sys
from typing import Any, Final

import pytest


_OPTION: Final = "--update-structures"
_DIR: Final = "__structures__"
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_.,=+@\[\]-]+")
_MAX_STEM: Final = 120
_WRITTEN: Final = pytest.StashKey[list[str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("treeshape", "treeshape structure snapshots")
    group.addoption(
        _OPTION,
        action="store_true",
        default=False,
        help="write (or rewrite) the __structures__/*.json snapshots checked by the "
        "structure_snapshot fixture, instead of comparing with them",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_WRITTEN] = []


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    written = config.stash.get(_WRITTEN, [])
    if written:
        terminalreporter.write_sep("-", f"treeshape: wrote {len(written)} structure snapshot(s)")
        for path in written:
            terminalreporter.write_line(path)


# -- `assert s1 == s2` ------------------------------------------------------------
def pytest_assertrepr_compare(config: pytest.Config, op: str, left: Any, right: Any) -> list[str] | None:
    """Explain a failed `==` between two Structures by their differences, path by path."""
    module = sys.modules.get("treeshape._structure")
    if op != "==" or module is None:  # no Structure can exist before treeshape is imported
        return None
    structure = module.Structure
    if not (isinstance(left, structure) and isinstance(right, structure)):
        return None
    try:
        mismatches = left.diff(right)
    except Exception as err:  # never let the explanation break the report
        return [f"{left!r} == {right!r}", f"(treeshape could not diff them: {type(err).__name__}: {err})"]
    lines = [f"{left!r} == {right!r}"]
    if not mismatches:
        lines.append("The structures differ only where Structure.diff reads one node as another (orbax's dict")
        lines.append("for an nnx State, {'value': ...} for an nnx Variable, a dict of field names for a module,")
        lines.append("the key '0' for the index 0): `matches` is True for them.")
        return lines
    count = len(mismatches)
    lines.append(f"{count} difference{'' if count == 1 else 's'} (left is expected, right is actual):")
    lines += [f"  {m}" for m in mismatches]
    return lines


# -- snapshots --------------------------------------------------------------------
def snapshot_stem(test_name: str) -> str:
    """A safe file name stem for a test's name (its node id after the file).

    Characters other than letters, digits and `_.,=+@[]-` become `_`; when
    anything is replaced (or the name is very long) a short hash of the
    original name is appended, so distinct tests never share a file.

    Examples:
        >>> from treeshape.pytest_plugin import snapshot_stem
        >>> snapshot_stem("test_params[bf16-8]")
        'test_params[bf16-8]'
        >>> snapshot_stem("TestModel::test_init")
        'TestModel.test_init'
        >>> snapshot_stem("test_io[a/b c]")
        'test_io[a_b_c]-e2141ec2'
    """
    name = test_name.replace("::", ".")
    stem = _UNSAFE.sub("_", name).strip(".")
    if stem != name or len(stem) > _MAX_STEM or not stem:
        digest = hashlib.sha256(test_name.encode()).hexdigest()[:8]
        stem = f"{stem[:_MAX_STEM]}-{digest}" if stem else digest
    return stem


class StructureSnapshot:
    """The `structure_snapshot` fixture: check trees against JSON snapshots beside the test.

    `check(tree)` compares the structure of `tree` with
    `__structures__/<test name>.json` in the test file's folder. Several calls
    in one test: the first unnamed call uses `<test name>.json`, the next ones
    `<test name>-2.json`, `-3`, ...; or give each a `name`, which picks
    `<test name>-<name>.json`.
    """

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._update = bool(request.config.getoption("update_structures"))
        self._unnamed = 0
        self._used: set[pathlib.Path] = set()

    def path(self, name: str | None = None) -> pathlib.Path:
        """The snapshot file for this test (and `name`), without checking anything."""
        node = self._request.node
        directory = pathlib.Path(str(node.path)).parent / _DIR
        test_name = node.nodeid.split("::", 1)[1] if "::" in node.nodeid else node.name
        stem = snapshot_stem(test_name)
        if name is not None:
            stem = f"{stem}-{snapshot_stem(name)}"
        return directory / f"{stem}.json"

    def check(self, tree: Any, *, name: str | None = None) -> None:
        """Compare the structure of `tree` with its snapshot (or write it, with `--update-structures`).

        Args:
            tree: A pytree (compared through `treeshape.structure_of`) or a
                `treeshape.Structure`.
            name: Tells several snapshots of one test apart: the file is
                `<test name>-<name>.json`. Unnamed calls are numbered.

        Raises:
            pytest.fail.Exception: the snapshot is missing or unreadable, or
                the structure differs from it (listing every difference by
                path); the message names `--update-structures`.
            ValueError: the same snapshot file is checked twice in one test.
        """
        __tracebackhide__ = True
        if name is None:
            self._unnamed += 1
            path = self.path(None if self._unnamed == 1 else str(self._unnamed))
        else:
            path = self.path(name)
        if path in self._used:
            raise ValueError(
                f"structure_snapshot: {path.name} is already checked in this test; give each check(...) its own `name=`"
            )
        self._used.add(path)

        from . import Structure, structure_of

        structure = tree if isinstance(tree, Structure) else structure_of(tree)
        text = structure.to_json()
        shown = _shown(path, self._request.config)
        if self._update:
            if not path.exists() or path.read_text(encoding="utf-8") != text and not _fits(path, text):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                self._request.config.stash[_WRITTEN].append(shown)
            return
        if not path.exists():
            pytest.fail(
                f"structure_snapshot: no snapshot {shown} yet; run pytest with {_OPTION} to write it",
                pytrace=False,
            )
        try:
            expected = Structure.from_json(path.read_bytes())
        except ValueError as err:
            pytest.fail(
                f"structure_snapshot: cannot read {shown}: {err}\nRerun with {_OPTION} to rewrite it.",
                pytrace=False,
            )
        # Compare what JSON keeps on both sides (e.g. a static enum leaf is kept by its repr).
        actual = Structure.from_json(text)
        mismatches = expected.diff(actual)
        if mismatches:
            count = len(mismatches)
            listing = "\n".join(f"  * {m}" for m in mismatches)
            pytest.fail(
                f"structure_snapshot: the structure differs from {shown}; {count} "
                f"difference{'' if count == 1 else 's'} (expected is the snapshot):\n{listing}\n"
                f"If the change is intended, rerun with {_OPTION} to rewrite the snapshot.",
                pytrace=False,
            )


def _fits(path: pathlib.Path, text: str) -> bool:
    """Whether the snapshot at `path` already describes the structure written as `text`: a
    snapshot with symbolic dimensions (`b`) describes every size, and is kept."""
    from . import Structure

    try:
        expected = Structure.from_json(path.read_bytes())
    except ValueError:
        return False
    return bool(expected.dims) and expected.matches(Structure.from_json(text))


def _shown(path: pathlib.Path, config: pytest.Config) -> str:
    try:
        return str(path.relative_to(config.rootpath))
    except ValueError:
        return str(path)


@pytest.fixture
def structure_snapshot(request: pytest.FixtureRequest) -> StructureSnapshot:
    """Check trees against JSON snapshots in `__structures__/` beside the test file.

    `structure_snapshot.check(tree)` compares `ts.structure_of(tree)` (or a
    `ts.Structure`) with `__structures__/<test name>.json`; a missing or
    different snapshot fails the test and names `--update-structures`, which
    writes or rewrites them.
    """
    return StructureSnapshot(request)
