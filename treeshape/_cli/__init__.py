"""The command-line wing: the `treeshape` command, `treeshape demo`, `treeshape inspect`,
`treeshape cost`, `treeshape fit`, `treeshape plan`, `treeshape residuals`, `treeshape targets`
and `treeshape restore-plan`.

Every failure is one line on stderr (`treeshape: error: ...`, control
characters escaped) and a non-zero exit status: 2 for bad input on the command
line (usage, a malformed spec, an unknown module or attribute, a budget or
sizes that `fit` cannot use), worded with what to type instead, 1 for an error
raised by the user's code (while importing the module, calling the function,
or showing its output), `SystemExit` included. `--traceback` adds the Python
traceback. `KeyboardInterrupt` is left alone.

JAX, and the modules that import it, are imported inside the functions that
need them: `treeshape --help` and usage errors answer without loading JAX,
and the user's module can configure JAX before it is imported.

The console script (`treeshape._cli:main`) and `python -m treeshape` import this front,
never a room of the wing:

- `_main`: `main`, the subcommand's room called and every failure printed as one line;
- `_parser`: the parser, its top-level options, each subcommand's room asked for its own;
- `_arguments`: what the subcommands' parsers share (the specs' language, `--target`);
- `_start`: JAX's start-up, accelerator plugins' chatter left out, the CPU for `--target`;
- `_fail`: `Fail`, the one-line failure and its exit status, and a message made printable;
- `_common`: what the subcommands that call `MODULE:ATTR` share: the attribute resolved,
  the specs parsed and the function called on them, `--target` checked, a result printed
  as its table or as JSON;
- `_inspect`, `_cost`, `_fit`, `_plan`, `_residuals`, `_targets`, `_demo`, `_restore`: one subcommand
  each (`declare`, its parser; `run`; `_cost` draws `--timeline` and `--plot`).
"""

from ._common import parse_bytes as parse_bytes
from ._main import main as main
