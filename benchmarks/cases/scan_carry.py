"""Case 9, `scan_carry`: a `lax.scan` whose carry comes from `scan_carry` vs one cast by hand (issue 3).

The train step of case 8, now with **bf16** parameters meeting the f32 Adam
state and f32 batches: under `policy="promote"` the parameters become f32 (2
traces). One jitted function builds the carry with `ts.scan_carry(body,
init, xs, policy="promote")`, the other casts by hand (`p.astype(jnp.float32)`
on the parameters); both then run `lax.scan(body, carry, xs)` over 64 steps.

Why the baseline is fair: the hand cast is exactly what a user who knows the
answer would write, so the compiled code should be identical.

- *Optimized HLO*: the instructions (lines `name = type opcode(...)`) of
  `jax.jit(f).lower(init, xs).compile().as_text()`, counted for each side.
  Goal: equal. The note also says whether the count of *every opcode* is the
  same (the JSON has both histograms); the texts differ only in their
  metadata (module name, source locations).
- *Runtime*: the two `Compiled` executables called on the same arguments and
  timed to `block_until_ready`, interleaved. Goal 0.9-1.1x.
"""

import collections
import re

import jax
import jax.numpy as jnp
from jax import lax

import treeshape as ts

from harness import Config, Goal, Row, case, compare, repeat, timed_row, within
from workloads import SCAN_STEPS, AdamCarry, Batch, adam_inputs, make_train_step


_HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+ = ")
_HLO_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\(")


def hlo_opcodes(text: str) -> collections.Counter[str]:
    """The instructions of an optimized HLO module, counted by opcode: the
    lines `name = type opcode(operands), ...` of every computation."""
    ops: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if " = " in line and _HLO_INSTRUCTION.match(line):
            found = _HLO_OPCODE.search(line.split(" = ", 1)[1])
            ops[found.group(1) if found else "?"] += 1
    return ops


@case("scan_carry")
def scan_carry_hlo(cfg: Config) -> list[Row]:
    """9. A lax.scan whose carry comes from scan_carry vs one cast by hand with .astype."""
    init, xs = adam_inputs("bfloat16")  # bf16 params meet the f32 Adam state and batches: promoted to f32
    body = make_train_step()

    def by_hand(init: AdamCarry, xs: Batch) -> tuple[AdamCarry, jax.Array]:
        params, opt_state = init
        params = jax.tree.map(lambda p: p.astype(jnp.float32), params)
        return lax.scan(body, (params, opt_state), xs)

    def with_treeshape(init: AdamCarry, xs: Batch) -> tuple[AdamCarry, jax.Array]:
        return lax.scan(body, ts.scan_carry(body, init, xs, policy="promote"), xs)

    compiled = [jax.jit(f).lower(init, xs).compile() for f in (by_hand, with_treeshape)]
    ops = [hlo_opcodes(c.as_text() or "") for c in compiled]
    counts = [sum(o.values()) for o in ops]
    same_ops = ops[0] == ops[1]
    opcode_diff = {k: ops[1][k] - ops[0][k] for k in ops[0] | ops[1] if ops[1][k] != ops[0][k]}
    rows = [
        Row(
            "9 scan_carry vs hand-cast scan: optimized HLO instructions",
            counts[0],
            counts[1],
            Goal("==", 0, "equal"),
            unit="instr",
            measured=counts[1] - counts[0],
            measured_unit="instr",
            note=(
                "bf16 params, f32 Adam state and batches, policy='promote'; instructions of "
                "jax.jit(f).lower(...).compile().as_text(); "
                + ("same count for every opcode" if same_ops else f"opcode counts differ: {opcode_diff}")
            ),
            detail={"opcodes_by_hand": dict(ops[0]), "opcodes_treeshape": dict(ops[1]), "same_opcodes": same_ops},
        )
    ]
    outs = [jax.block_until_ready(c(init, xs)) for c in compiled]
    assert ts.structure_of(outs[0]) == ts.structure_of(outs[1]), "both scans must return the same types"
    t = compare(
        repeat(lambda: jax.block_until_ready(compiled[0](init, xs))),
        repeat(lambda: jax.block_until_ready(compiled[1](init, xs))),
        cfg,
        reps=21,
    )
    rows.append(
        timed_row(
            f"9 scan_carry vs hand-cast scan: runtime, {SCAN_STEPS} steps",
            t,
            within(0.9, 1.1),
            "the two compiled executables, timed to block_until_ready",
        )
    )
    return rows
