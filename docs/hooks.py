"""mkdocs hook: run the top-level notebooks/ and serve them as docs/notebooks/.

The notebooks stay where the project keeps them (and where the tests run them,
stored without outputs); each is run here as tests/test_notebooks.py runs it,
and the run copy, in a temporary folder, is added to the build as
`notebooks/NAME.ipynb` for mkdocs-jupyter to convert. Nothing is copied into
docs/ or committed.

The kernel forwards what the notebook's code prints (stdout, stderr, warnings,
JAX's logging) into the page, but not what native libraries write straight to
the process's standard error: JAX's CUDA plugin, installed without a GPU (the
`test` extra brings it for `target=`), logs "Could not find cuda drivers" when
JAX is imported, whatever JAX_PLATFORMS says. That goes to the build's log.
"""

import pathlib
import tempfile

import nbclient
import nbformat
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files


ROOT = pathlib.Path(__file__).resolve().parents[1]
# The same kernel options as tests/test_notebooks.py: what the page shows is what the test checks.
KERNEL_ARGS = ["--IPKernelApp.capture_fd_output=False"]
_RUNS = tempfile.TemporaryDirectory(prefix="treeshape-notebooks-")  # removed when mkdocs exits


@event_priority(100)  # before mkdocs-jupyter's on_files wraps .ipynb files
def on_files(files: Files, config) -> Files:
    runs = _RUNS.name
    (pathlib.Path(runs) / "notebooks").mkdir(exist_ok=True)
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(
            notebook,
            timeout=600,
            kernel_name="python3",
            extra_arguments=KERNEL_ARGS,
            resources={"metadata": {"path": str(path.parent)}},
        )
        client.execute()  # raises CellExecutionError, with the cell, on any error
        uri = path.relative_to(ROOT).as_posix()
        nbformat.write(notebook, pathlib.Path(runs) / uri)
        files.append(File(uri, runs, config.site_dir, config.use_directory_urls))
    return files
