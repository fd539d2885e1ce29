"""The package's shape, as docs/architecture.md lays it out: the imports form floors (floor 1
imports no module of the package; every other module is one floor above the highest module it
imports), the page's table puts each module on its floor, no module imports another inside a
function to dodge a cycle, `treeshape/__init__.py` names each public name once, and the
public classes report module `treeshape`, where users import them from."""

import ast
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys

import pytest

import treeshape


PACKAGE = pathlib.Path(treeshape.__file__).parent
PAGE = PACKAGE.parent / "docs" / "architecture.md"
# A wing is a private subpackage of rooms (`_cost/_program.py` is the module `_cost._program`);
# its `__init__.py`, the front, is the module `_cost`, and the rest of the package imports the
# front, never a room.
WINGS = {p.parent.name for p in PACKAGE.glob("_*/__init__.py")}


def _module_of(path: pathlib.Path) -> str:
    relative = path.relative_to(PACKAGE).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


FILES = {
    _module_of(p): p
    for p in [*PACKAGE.glob("*.py"), *PACKAGE.glob("_*/*.py")]
    if p.name != "__init__.py" or p.parent != PACKAGE
}
MODULES = set(FILES)
# Modules that import late on purpose (not for a cycle): the command line's rooms load JAX
# only once it runs a command, so `--help` and usage errors stay fast; pytest loads the plugin
# before any conftest.py, which must still be able to configure JAX.
LATE_IMPORTS_ALLOWED = {
    "_cli._common",
    "_cli._cost",
    "_cli._demo",
    "_cli._fail",
    "_cli._fit",
    "_cli._inspect",
    "_cli._parser",
    "_cli._plan",
    "_cli._residuals",
    "_cli._restore",
    "_cli._targets",
    "pytest_plugin",
}


def _imported(module: str, node: ast.ImportFrom) -> set[str]:
    """The package modules a relative import in `module` reads (`from . import cost` reads
    `_cost`, the module the package's lazy table imports `cost` from; in a room of the wing
    `_cost`, `from . import _hlo` reads `_cost._hlo` and `from .._leaf import x` reads `_leaf`)."""
    home = list(FILES[module].parent.relative_to(PACKAGE).parts)
    if node.level < 1 or node.level - 1 > len(home):
        return set()
    base = home[: len(home) - (node.level - 1)]
    if node.module:
        return {".".join([*base, node.module.split(".")[0]])}
    names = {alias.name for alias in node.names}
    found = {".".join([*base, n]) for n in names} & MODULES
    if not base:
        found |= {treeshape._MODULES[n].lstrip(".") for n in names if n in treeshape._MODULES}
    return found


def _imports(module: str) -> tuple[set[str], set[str]]:
    """The package modules `module` imports anywhere, and those it imports only inside functions."""
    tree = ast.parse(FILES[module].read_text())
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    in_functions = {id(node) for f in functions for node in ast.walk(f)}
    top: set[str] = set()
    late: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            (late if id(node) in in_functions else top).update(_imported(module, node) - {module})
    return top | late, late - top


def graph() -> dict[str, set[str]]:
    return {m: _imports(m)[0] for m in MODULES}


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's floor in an import graph (module: the modules it imports)."""
    found: dict[str, int] = {}
    path: list[str] = []

    def floor(m: str) -> int:
        if m in path:
            raise AssertionError(f"import cycle: {' -> '.join([*path[path.index(m) :], m])}")
        if m not in found:
            path.append(m)
            found[m] = 1 + max((floor(d) for d in graph[m]), default=0)
            path.pop()
        return found[m]

    for m in sorted(graph):
        floor(m)
    return found


def page_floors() -> dict[str, list[int]]:
    """The floors docs/architecture.md gives each module: the rows `| N | `_module` | ... |` of
    its table `| floor | module | owns |` (a module listed twice has two)."""
    text = PAGE.read_text()
    header = re.search(r"^\|\s*floor\s*\|\s*module\s*\|.*\n\|[-| :]+\|\n", text, flags=re.MULTILINE)
    assert header, "docs/architecture.md has no table with the header `| floor | module | owns |`"
    listed: dict[str, list[int]] = {}
    for line in text[header.end() :].splitlines():
        row = re.match(r"\|\s*(\d+)\s*\|\s*`([\w.]+)`\s*\|", line)
        if not row:
            break
        listed.setdefault(row[2], []).append(int(row[1]))
    return listed


def test_the_architecture_page_puts_each_module_on_its_floor():
    imports = graph()
    code, page = floors(imports), page_floors()
    wrong = [
        f"`{m}` is on floor {code[m]} (it imports {sorted(imports[m]) or 'no package module'}), "
        + (f"the page lists it on floor {', '.join(map(str, page[m]))}" if m in page else "the page does not list it")
        for m in sorted(code, key=lambda m: (code[m], m))
        if page.get(m) != [code[m]]
    ]
    wrong += [f"`{m}` is on the page (floor {page[m]}) but is no module of the package" for m in page if m not in code]
    assert not wrong, "docs/architecture.md's table `| floor | module | owns |` is out of date:\n" + "\n".join(wrong)


def test_the_floors_hold_the_modules_the_page_describes_below_others():
    imports = graph()
    code = floors(imports)
    # the compatibility wing stands on the ground: its rooms import no module outside it
    compat = {m for m in MODULES if m.split(".")[0] == "_compat"}
    assert {m for m in compat if imports[m] - compat} == set() and min(code[m] for m in compat) == 1
    # framework knowledge below the tree model, and the tree model below every walker
    assert code["_nodes"] < code["_tree"] < code["_leaf"] < code["_structure"] < code["_infer"] < code["_carry"]
    assert all(code["_tree"] < code[m] for m in ["_json", "_diff", "_table", "_sharding", "_dims", "_cache"])
    assert imports["_diff"] <= {"_compat", "_errors", "_leaf", "_nodes", "_shapes", "_tree", "_views"}
    assert "_infer" not in imports["_structure"] and "_cache" not in imports["_structure"]
    assert "_infer" not in imports["_weak"]


def test_floors_count_up_from_modules_that_import_none_and_report_a_cycle():
    assert floors({"_a": set(), "_b": {"_a"}, "_c": {"_a", "_b"}}) == {"_a": 1, "_b": 2, "_c": 3}
    try:
        floors({"_a": {"_b"}, "_b": {"_c"}, "_c": {"_a"}, "_d": set()})
    except AssertionError as e:
        assert str(e) == "import cycle: _a -> _b -> _c -> _a"
    else:
        raise AssertionError("a cycle was not reported")


def test_no_function_level_imports_inside_the_package():
    late = {m: _imports(m)[1] for m in MODULES - LATE_IMPORTS_ALLOWED}
    assert {m: v for m, v in late.items() if v} == {}


def test_no_module_imports_the_package_by_its_absolute_name():
    """`import treeshape` or `from treeshape import ...` inside the package: a late import
    that hides a dependency from the floors (a relative `from . import name` shows it)."""
    found = []
    for m in sorted(MODULES):
        for node in ast.walk(ast.parse(FILES[m].read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            found += [
                f"{FILES[m].relative_to(PACKAGE)}:{node.lineno} imports {n}"
                for n in names
                if n.split(".")[0] == "treeshape"
            ]
    assert found == []


def test_the_public_names_are_written_once():
    """`_MODULES` in `treeshape/__init__.py` is the one list (`__all__` is its keys); the
    `TYPE_CHECKING` imports, which type checkers read, import exactly those names from exactly
    those modules, each as itself (a re-export)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    (checking,) = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    imported = {}
    for node in ast.walk(checking):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                assert alias.asname == alias.name, f"write `{alias.name} as {alias.name}` (an explicit re-export)"
                imported[alias.name] = "." * node.level + (node.module or "")
    assert imported == treeshape._MODULES
    assert treeshape.__all__ == sorted(treeshape._MODULES)


# -- public classes as users import them -----------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "Structure",
        "Mismatch",
        "StructureMismatchError",
        "CarryMismatchError",
        "PrecisionWarning",
        "CacheInfo",
        "StaticRepr",
        "JaxReleaseError",
        "Residual",
        "Residuals",
    ],
)
def test_public_classes_report_module_treeshape(name):
    cls = getattr(treeshape, name)
    assert cls.__module__ == "treeshape" and repr(cls) == f"<class 'treeshape.{name}'>"
    assert pickle.loads(pickle.dumps(cls)) is cls


def _defined(module: str) -> set[str]:
    """The names a package module defines at its top level (functions, classes, assignments),
    and those a wing's front hands on from its rooms."""
    names: set[str] = set()
    front = FILES[module].name == "__init__.py"
    for node in ast.parse(FILES[module].read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif front and isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_no_module_imports_another_modules_private_name():
    """`from ._infer import _JITTED`: a module's private name is its own; what another module
    needs is public in its home (a module itself, `from . import _cache`, is imported by name)."""
    found = []
    for m in sorted(MODULES):
        for node in ast.walk(ast.parse(FILES[m].read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level < 1:
                continue
            modules = _imported(m, node)
            found += [
                f"{FILES[m].relative_to(PACKAGE)}:{node.lineno} imports {alias.name}"
                for alias in node.names
                if alias.name.startswith("_")
                and not alias.name.startswith("__")
                and not any(x == alias.name or x.endswith("." + alias.name) for x in modules)
            ]
    assert found == []


def test_every_name_the_page_gives_is_in_the_code():
    page = PAGE.read_text()
    wrong = sorted(
        f"`{module}.{name}`"
        for module, name in set(re.findall(r"`(_\w+(?:\._\w+)?)\.(\w+)", page))
        if f"{module}.{name}" not in MODULES and (module not in MODULES or name not in _defined(module))
    )
    assert not wrong, f"docs/architecture.md names what the code no longer has: {', '.join(wrong)}"


def test_the_rest_of_the_package_imports_a_wing_through_its_front():
    """A room of a wing (`_cost._program`) is imported by its wing's front and its other rooms
    only; tests may reach into a room, the package may not."""
    imports = graph()
    wrong = sorted(
        f"`{m}` imports `{room}`"
        for m in MODULES
        for room in imports[m]
        if "." in room and room.split(".")[0] != m.split(".")[0]
    )
    assert WINGS == {"_cli", "_compat", "_cost"} and wrong == []


def test_a_source_tree_that_is_not_installed_imports_and_its_version_says_so(tmp_path):
    """A copy of the package on PYTHONPATH, run without site-packages (`-S`): no installed
    distribution of treeshape to read a version from (and no JAX, which `import treeshape`
    does not need)."""
    shutil.copytree(PACKAGE, tmp_path / "treeshape", ignore=shutil.ignore_patterns("__pycache__"))
    code = "import sys, treeshape; print(treeshape.__version__, treeshape.__file__, 'jax' in sys.modules, sep='\\n')"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-S", "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    version, where, imported_jax = done.stdout.splitlines()
    assert version == "unknown (not installed)"
    assert (where, imported_jax) == (str(tmp_path / "treeshape" / "__init__.py"), "False")


def _members(module: str, cls: str) -> set[str]:
    """The underscore members (not dunders) a class of `module` defines: its methods and
    properties, and the attributes its methods set on `self`."""
    tree = ast.parse(FILES[module].read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    names = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    names |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
            names.add(sub.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_a_structures_or_costs_underscore_members_are_read_elsewhere_through_their_views_only():
    """`Structure` and `Cost` are read by modules below them (diffs, tables, values, the
    command line): their underscore members that another room reads are declared once, in
    `_views` (`StructureView`, `CostView`), and no room reads any other."""
    from treeshape._views import READ_ELSEWHERE

    owners = {"Structure": "_structure", "Cost": "_cost._cost"}
    private = {cls: _members(module, cls) for cls, module in owners.items()}
    assert READ_ELSEWHERE["Structure"] <= private["Structure"] and READ_ELSEWHERE["Cost"] <= private["Cost"]
    undeclared = set().union(*(private[c] - READ_ELSEWHERE[c] for c in private))
    shared = {"_cache"}  # (a name other classes give their own members too; Structure's is never read)
    found = []
    for m in sorted(MODULES - set(owners.values())):
        for node in ast.walk(ast.parse(FILES[m].read_text())):
            if isinstance(node, ast.Attribute) and node.attr in undeclared - shared:
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append(f"{FILES[m].relative_to(PACKAGE)}:{node.lineno} reads .{node.attr}")
    assert found == []
