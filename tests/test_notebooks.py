"""The notebooks in `notebooks/` run top to bottom, and are stored clean.

The same check as `pytest --nbmake notebooks/`, inside the ordinary test run, with the kernel
the docs build runs them in (docs/hooks.py) and the environment of a user who installed the
`test` extra: what a notebook's code prints on stderr (JAX's plugin traceback included) fails it.
"""

import os
import pathlib

import jax
import nbclient
import nbformat
import pytest


NOTEBOOKS = sorted((pathlib.Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))
# As docs/hooks.py starts it: native libraries' own writes to the process's stderr (JAX's CUDA
# plugin logs "Could not find cuda drivers" on import where it is installed without a GPU)
# stay out of the notebook and the page; what the notebook's code prints is in both.
KERNEL_ARGS = ["--IPKernelApp.capture_fd_output=False"]
# The test suite's own settings (tests/conftest.py) are not the user's: a notebook sets what it
# needs itself (JAX_PLATFORMS=cpu before JAX starts, where JAX's CUDA plugin and libtpu are
# installed, as the `test` extra installs them). Before jax 0.10 the CUDA plugin checks the CUDA
# libraries even then, unless JAX_SKIP_CUDA_CONSTRAINTS_CHECK is set, which stays there: the
# README's notebooks run on the pinned release.
SUITE_SETTINGS = ("JAX_PLATFORMS", "XLA_FLAGS", "TPU_SKIP_MDS_QUERY") + (
    ("JAX_SKIP_CUDA_CONSTRAINTS_CHECK",) if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10) else ()
)


def test_there_are_notebooks():
    assert {path.name for path in NOTEBOOKS} >= {"tour.ipynb", "large_model.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_is_stored_without_outputs_and_opens_with_a_title(path):
    notebook = nbformat.read(path, as_version=4)
    first = notebook.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs(path):
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", extra_arguments=KERNEL_ARGS, resources={"metadata": {}}
    )
    env = {name: value for name, value in os.environ.items() if name not in SUITE_SETTINGS}
    client.execute(env=env)  # raises CellExecutionError, with the cell, on any error
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error" or (output.output_type == "stream" and output.name == "stderr")
    ]
    assert errors == []
