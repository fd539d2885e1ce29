"""Functions for `tests/test_cli.py` to inspect: `cli_fixtures:NAME`."""

import jax.numpy as jnp


NOT_CALLABLE = 3


def echo(*args, **kwargs):
    """Return the arguments as they arrive: their structure is the input's."""
    return {"args": args, "kwargs": kwargs}


def mlp(x, scale=1.0):
    return {"logits": (x @ jnp.ones((x.shape[-1], 10), x.dtype)) * scale}


def fails(x):
    raise ValueError("fixture failure\nsecond line of the message")


class Model:
    @staticmethod
    def apply(x):
        return {"y": x * 2, "n": x.size}
