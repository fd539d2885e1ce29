"""The releases of JAX treeshape supports, and the error for a feature one of them lacks.

treeshape supports every JAX release from its floor (0.8.0) to the newest. Where a release
lacks a feature, only that feature degrades: asking for it raises `JaxReleaseError`, which
names the feature and the first release that has it. Each room of this wing finds what its
release has by feature detection, never by its version.
"""

import jax


class JaxReleaseError(NotImplementedError):
    """A feature that the installed JAX release lacks.

    treeshape works on every JAX release from its floor (0.8.0) to the newest;
    where a release lacks a feature (a PRNG implementation, unreduced or reduced
    manual axes under `jax.shard_map`), only asking for that feature fails, with
    this error. Its message names the feature and the first release that brings
    it; `feature` and `since` hold them.

    Attributes:
        feature: What was asked for, in words (`"the PRNG implementation 'rbg'"`).
        since: The first JAX release that has it (`"0.10.2"`).

    Examples:
        >>> import treeshape as ts
        >>> err = ts.JaxReleaseError("unreduced manual axes", "99.0")
        >>> isinstance(err, NotImplementedError), err.since
        (True, '99.0')
        >>> print(err)
        treeshape: unreduced manual axes needs jax 99.0 or newer; this is jax ... Upgrade JAX ...
    """

    __module__ = "treeshape"  # as users import it (JAX's and pytest's messages show it)

    def __init__(self, feature: str, since: str) -> None:
        super().__init__(
            f"treeshape: {feature} needs jax {since} or newer; this is jax {jax.__version__}. "
            f"Upgrade JAX (`pip install -U 'jax>={since}'`) to use it."
        )
        self.feature, self.since = feature, since


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"JaxReleaseError": JaxReleaseError}
