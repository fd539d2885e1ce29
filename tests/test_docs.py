"""The docs cover the public API: every name in `treeshape.__all__` has a
`::: treeshape.NAME` line in docs/api/*.md (optax's coverage check), and every
page in mkdocs.yml's nav exists. `mkdocs build --strict` checks the rest."""

import pathlib
import re

import treeshape as ts


ROOT = pathlib.Path(__file__).parents[1]


def test_every_public_name_has_an_api_entry():
    text = "\n".join(path.read_text() for path in sorted((ROOT / "docs" / "api").glob("*.md")))
    documented = re.findall(r"^::: treeshape\.(\w+)\s*$", text, flags=re.MULTILINE)
    assert sorted(documented) == sorted(ts.__all__)


def test_every_nav_page_exists():
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    pages = re.findall(r"([\w/-]+\.(?:md|ipynb))", nav)
    assert pages
    for page in pages:
        where = ROOT / ("" if page.startswith("notebooks/") else "docs") / page
        assert where.exists(), page
