"""The HLO reader: protobuf wire format decoded as the protobuf library encodes it, and the
optimized module read as XLA prints it."""

import re

import jax
import jax.numpy as jnp
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given, strategies as st

from treeshape import _compat
from treeshape._cost._hlo import Module, fields, int_field, ints, message_field, str_field


def _message_classes():
    """`Outer` and `Inner`, built from a descriptor: a field of each wire type, a packed
    repeated field, nested messages and a field number that takes a two-byte key."""
    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="treeshape_test_hlo.proto", package="treeshape_test", syntax="proto3"
    )
    inner = file.message_type.add(name="Inner")
    inner.field.add(name="a", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    inner.field.add(name="s", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    outer = file.message_type.add(name="Outer")
    for name, number, kind, label in [
        ("i", 1, F.TYPE_INT64, F.LABEL_OPTIONAL),
        ("u", 2, F.TYPE_UINT64, F.LABEL_OPTIONAL),
        ("s", 3, F.TYPE_STRING, F.LABEL_OPTIONAL),
        ("packed", 5, F.TYPE_INT64, F.LABEL_REPEATED),
        ("f64", 6, F.TYPE_FIXED64, F.LABEL_OPTIONAL),
        ("f32", 7, F.TYPE_FIXED32, F.LABEL_OPTIONAL),
        ("far", 300, F.TYPE_INT64, F.LABEL_OPTIONAL),
    ]:
        outer.field.add(name=name, number=number, type=kind, label=label)
    for name, number, label in [("inner", 4, F.LABEL_OPTIONAL), ("many", 8, F.LABEL_REPEATED)]:
        outer.field.add(name=name, number=number, type=F.TYPE_MESSAGE, type_name=".treeshape_test.Inner", label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    get = message_factory.GetMessageClass
    return get(pool.FindMessageTypeByName("treeshape_test.Outer")), get(
        pool.FindMessageTypeByName("treeshape_test.Inner")
    )


OUTER, INNER = _message_classes()
INT64 = st.integers(-(2**63), 2**63 - 1)
INNERS = st.builds(lambda a, s: (a, s), INT64, st.text(max_size=20))


@given(
    i=INT64,
    u=st.integers(0, 2**64 - 1),
    s=st.text(max_size=300),  # past 127 bytes, the length takes two bytes
    inner=INNERS,
    packed=st.lists(INT64, max_size=20),
    f64=st.integers(0, 2**64 - 1),
    f32=st.integers(0, 2**32 - 1),
    many=st.lists(INNERS, max_size=5),
    far=INT64,
)
def test_fields_decode_what_protobuf_encodes(i, u, s, inner, packed, f64, f32, many, far):
    message = OUTER(i=i, u=u, s=s, packed=packed, f64=f64, f32=f32, far=far)
    message.inner.a, message.inner.s = inner
    for a, text in many:
        message.many.add(a=a, s=text)
    m = fields(message.SerializeToString())
    assert int_field(m, 1) == i
    assert m.get(2, [0])[-1] == u  # raw, as unsigned
    assert str_field(m, 3) == s
    assert (int_field(message_field(m, 4), 1), str_field(message_field(m, 4), 2)) == inner
    assert ints(m, 5) == packed
    assert (m.get(6, [0])[-1], m.get(7, [0])[-1]) == (f64, f32)
    assert [(int_field(fields(x), 1), str_field(fields(x), 2)) for x in m.get(8, [])] == many
    assert int_field(m, 300) == far


def test_an_absent_field_reads_as_its_default():
    m = fields(OUTER().SerializeToString())
    assert m == {}
    assert (int_field(m, 1), int_field(m, 1, default=-1), str_field(m, 3), message_field(m, 4), ints(m, 5)) == (
        0,
        -1,
        "",
        {},
        [],
    )


def test_a_wire_type_protobuf_does_not_write_is_refused():
    with pytest.raises(ValueError, match="wire type 3"):
        fields(bytes([(1 << 3) | 3]))


def _printed_computations(text: str) -> dict[str, list[str]]:
    """Each computation of XLA's printed module, by name (the entry's as `ENTRY`): its
    instructions' names in order."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        head = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            current = out.setdefault("ENTRY" if head.group(1) else head.group(2), [])
        elif line.startswith("}"):
            current = None
        elif current is not None:
            name = re.match(r"^\s+(?:ROOT )?%?([\w.\-]+) = ", line)
            if name:
                current.append(name.group(1))
    return out


def test_the_module_reads_as_xla_prints_it():
    def f(x, n):
        def body(carry):
            i, y = carry
            return i + 1, jnp.tanh(y @ y)

        return jax.lax.while_loop(lambda c: c[0] < n, body, (0, x))[1].sum()

    compiled = jax.jit(f).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32), 3).compile()
    module = Module.read(_compat.optimized_module(compiled))
    printed = _printed_computations(compiled.as_text())
    scheduled = {c: [module.instructions[i].name for i in order] for c, order in module.sequences.items() if order}
    assert len(scheduled) >= 3  # the entry, the loop's condition and body
    for names in scheduled.values():
        assert names in printed.values()
    assert scheduled[module.entry] == printed["ENTRY"]
    assert module.instructions[module.roots[module.entry]].name == printed["ENTRY"][-1]
    assert sorted(module.parameters[module.entry]) == [0, 1]
    assert [module.instructions[i].opcode for i in module.parameters[module.entry].values()] == ["parameter"] * 2


def test_both_readers_of_a_module_find_the_same_loops_and_the_walk_counts_them():
    """The optimized module as text (`_hlo_text`, walked by `_hlo_loops.walk`) and as XLA's
    message (`_hlo`) name the same loops: each `while`'s body and condition alike; the walk
    reaches the inner loop 5 times (once a run of the outer body) and its body's
    instructions 15 times, its condition's 20."""
    from treeshape._cost import _hlo_loops, _hlo_text

    def f(x):
        def outer(h, _):
            return jax.lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ h), h), None

        return jax.lax.scan(outer, x, length=5)[0]

    compiled = jax.jit(f).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32)).compile()
    text = _hlo_text.parse(compiled.as_text())
    proto = Module.read(_compat.optimized_module(compiled))
    assert text is not None
    by_name = {i.name: i for i in proto.instructions.values()}
    steps = list(_hlo_loops.walk(text))
    loops = [s for s in steps if s.loop is not None]
    assert sorted((s.runs, s.trips) for s in loops) == [(1, 5), (5, 3)]
    for step in loops:
        assert step.instruction.opcode == by_name[step.instruction.name].opcode == "while"
        body, condition = proto.loop(by_name[step.instruction.name])
        assert (proto.names[body], proto.names[condition]) == (step.loop.body, step.loop.condition)
    inner = next(s.loop for s in loops if s.runs == 5)
    assert {s.runs for s in steps if s.computation.name == inner.body} == {15}
    assert {s.runs for s in steps if s.computation.name == inner.condition} == {20}
