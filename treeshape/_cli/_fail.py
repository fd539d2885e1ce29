"""How the command fails: `Fail`, a failure reported as one line with an exit status; the
errors of the user's code it turns into one (`USER_ERRORS`); and a message's text made
printable (`printable`) and one line (`one_line`)."""

from typing import Any, Final


class Fail(Exception):
    """A failure to report as one line, with an exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# The exceptions user code may raise that become a one-line error (KeyboardInterrupt stays as it is).
USER_ERRORS: Final = (Exception, SystemExit)


def printable(text: str) -> str:
    """`text` with control and other non-printable characters escaped (`\\n`, `\\x1b`), so that
    nothing a user's code writes into a message can corrupt the terminal or add a line. (As the
    table's `printable`, kept here so that the command line starts without importing JAX.)"""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} whose repr raised>"


def one_line(err: BaseException) -> str:
    """`TYPE: the first line of the message`, escaped, at most 300 characters; never raises."""
    name = type(err).__name__
    if isinstance(err, SystemExit):
        return f"{name} with code {printable(_safe_repr(err.code))}"
    try:
        message = str(err)
    except Exception as inner:
        return f"{name} (its message cannot be shown: str() raised {type(inner).__name__})"
    lines = message.strip().splitlines()
    from .._tree import clip

    return clip(printable(f"{name}: {lines[0].strip()}" if lines else name), 300)
