"""`python -m treeshape`: the same as the `treeshape` console script."""

import sys

from ._cli import main


if __name__ == "__main__":
    sys.exit(main())
