"""mkdocs hook: serve the top-level notebooks/ as docs/notebooks/.

The notebooks stay where the project keeps them (and where the tests run
them); this adds each one to the build as `notebooks/NAME.ipynb`, read from the
repository root, before mkdocs-jupyter converts (and executes) it. Nothing is
copied into docs/.
"""

import pathlib

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files


ROOT = pathlib.Path(__file__).resolve().parents[1]


@event_priority(100)  # before mkdocs-jupyter's on_files wraps .ipynb files
def on_files(files: Files, config) -> Files:
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        # A plain File whose source directory is the repository root, so that
        # `abs_src_path` is the notebook itself (mkdocs-jupyter reads it there).
        uri = path.relative_to(ROOT).as_posix()
        files.append(File(uri, str(ROOT), config.site_dir, config.use_directory_urls))
    return files
