"""The notebooks in `notebooks/` run top to bottom, and are stored clean.

The same check as `pytest --nbmake notebooks/`, inside the ordinary test run.
"""

import pathlib

import nbclient
import nbformat
import pytest


NOTEBOOKS = sorted((pathlib.Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


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
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {}})
    client.execute()  # raises CellExecutionError, with the cell, on any error
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error" or (output.output_type == "stream" and output.name == "stderr")
    ]
    assert errors == []
