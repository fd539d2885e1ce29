"""Functions for `tests/test_cli.py` to inspect: `cli_fixtures:NAME`."""

import sys

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


def repeat(x, n, *, axis=0):
    """Needs `n` and `axis` as Python ints: a literal is passed concrete."""
    return jnp.concatenate([x] * n, axis=axis)


def quits(x):
    sys.exit(3)


def quits_quietly(x):
    sys.exit()


class BadRepr:
    """A static output leaf whose repr raises."""

    def __repr__(self):
        raise RuntimeError("repr is broken")


class TerminalRepr:
    """A static output leaf whose repr writes a newline and a terminal colour code."""

    def __repr__(self):
        return "line one\nline two \x1b[31mred\x1b[0m"


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("str is broken")


def bad_repr(x):
    return {"x": x, "obj": BadRepr()}


def terminal_repr(x):
    return {"x": x, "obj": TerminalRepr()}


def bad_str_error(x):
    raise BadStr()


def terminal_error(x):
    raise ValueError("\x1b[31mred\x1b[0m alert\rover\nsecond line")


def tile(pair):
    """A pair (array, count): the count, a literal inside a tuple spec, must stay concrete."""
    x, n = pair
    return jnp.tile(x, n)
