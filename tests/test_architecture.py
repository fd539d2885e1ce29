"""The package's shape, as docs/architecture.md describes it: imports form a DAG,
and no module imports another inside a function to dodge a cycle."""

import ast
import graphlib
import pathlib

import treeshape


PACKAGE = pathlib.Path(treeshape.__file__).parent
# Modules that import late on purpose (not for a cycle): the command line loads
# JAX only once it runs a command, so `--help` and usage errors stay fast.
LATE_IMPORTS_ALLOWED = {"_cli"}


def _imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """The package modules `path` imports at module level, and inside functions."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    late: set[str] = set()

    def names(node: ast.ImportFrom) -> set[str]:
        if node.level != 1:
            return set()
        if node.module:
            return {node.module.split(".")[0]}
        return {alias.name for alias in node.names}

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            late |= names(node)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            top |= names(node)
        elif isinstance(node, ast.If):  # `if TYPE_CHECKING:` in __init__
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom):
                    top |= names(inner)
    return top, late - top


def _graph() -> dict[str, set[str]]:
    return {p.stem: _imports(p)[0] for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


def test_imports_form_a_dag():
    try:
        order = list(graphlib.TopologicalSorter(_graph()).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None
    assert order.index("_leaf") < order.index("_structure") < order.index("_infer") < order.index("_carry")


def test_the_graph_is_what_the_architecture_page_says():
    graph = _graph()
    assert graph["_leaf"] == {"_compat", "_tree"}
    assert graph["_tree"] == {"_compat", "_nodes"}  # the tree model, below every walker
    assert graph["_compat"] == set()
    assert "_infer" not in graph["_structure"] and "_cache" not in graph["_structure"]
    assert graph["_nodes"] == {"_compat"}  # framework knowledge, below everything that reads node data
    assert graph["_diff"] <= {"_compat", "_errors", "_leaf", "_nodes", "_tree"}
    assert "_infer" not in graph["_weak"]


def test_no_function_level_imports_inside_the_package():
    late = {p.stem: _imports(p)[1] for p in PACKAGE.glob("*.py") if p.stem not in LATE_IMPORTS_ALLOWED}
    assert {k: v for k, v in late.items() if v} == {}


def test_every_module_is_on_the_architecture_page():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert {m for m in modules if f"`{m}`" not in page} == set()
