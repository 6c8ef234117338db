"""Hypothesis strategies for arbitrary protobuf messages, built by walking descriptors.

`hypothesis.strategies.from_type` knows nothing of protobuf, so this walks each message's
fields and draws, per field kind, a mix of ordinary values and the extremes that break
services: empty / huge / odd strings, NaN / inf / huge floats, int boundaries, unknown
enum numbers, long repeated fields, deep `google.protobuf.Value` trees, every oneof
member (or none). `overrides` maps a field's full name to a strategy, for fields whose
free values would be unsafe to send (a snapshot directory, say).
"""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf import struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

F = FieldDescriptor

# Names that exist on the fuzzed server (so calls get past NOT_FOUND) and names that
# must be refused: reserved characters, other tenants' spaces, path tricks, overlong.
NAMES = ["fz", "fz-hnsw", "fz-ip4", "fz.mem", "default", "docs"]
ODD_STRINGS = [
    "",
    " ",
    "\t\n",
    "memory:default",
    "a:b",
    "../../etc/passwd",
    "a/b",
    "a" * 129,
    "é名前🙂",
    "\x00",
    "\u202e",
    "NaN",
    "-1",
    "rpk_000000000000_x",
    "Bearer x",
    "x" * 1025,
]
# (unit, repeat): built lazily so strategy reprs stay small
HUGE_STRINGS = [("w ", 40_000), ("y", 70_000)]  # past the default 64 KiB text limit

FLOATS32 = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    1e-45,
    3.4e38,
    -3.4e38,
    1e30,
    float("nan"),
    float("inf"),
    float("-inf"),
]
FLOATS64 = FLOATS32 + [1e308, -1e308, 5e-324, 253402300799.0, 1e19]
INT32 = [0, 1, -1, 2, 10, 64, 100, 1000, 10_000, 10_001, 65_536, 2**31 - 1, -(2**31)]
INT64 = INT32 + [2**63 - 1, -(2**63), 2**40, 10**12]
UINT32 = [0, 1, 2**32 - 1]
UINT64 = [0, 1, 2**64 - 1]


def strings() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(NAMES),
        st.sampled_from(ODD_STRINGS),
        st.text(max_size=12),
        st.sampled_from(HUGE_STRINGS).map(lambda p: p[0] * p[1]),
    )


def _floats(double: bool) -> st.SearchStrategy[float]:
    return st.one_of(
        st.sampled_from(FLOATS64 if double else FLOATS32),
        st.floats(allow_nan=True, allow_infinity=True, width=64 if double else 32),
    )


def deep_value(depth: int) -> struct_pb2.Value:
    """A Value nested `depth` levels (alternating struct and list)."""
    v = struct_pb2.Value(string_value="bottom")
    for i in range(depth):
        outer = struct_pb2.Value()
        if i % 2:
            outer.list_value.values.add().CopyFrom(v)
        else:
            outer.struct_value.fields["k"].CopyFrom(v)
        v = outer
    return v


def json_values(max_depth: int = 120) -> st.SearchStrategy[struct_pb2.Value]:
    """google.protobuf.Value trees: NaN/inf numbers, huge strings, and nesting deeper than
    protobuf's parse recursion limit (100)."""

    def leaf() -> st.SearchStrategy[struct_pb2.Value]:
        return st.one_of(
            st.builds(lambda: struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)),
            st.builds(lambda x: struct_pb2.Value(number_value=x), _floats(True)),
            st.builds(lambda s: struct_pb2.Value(string_value=s), strings()),
            st.builds(lambda b: struct_pb2.Value(bool_value=b), st.booleans()),
            st.just(struct_pb2.Value()),  # kind unset
        )

    def to_list(vs: list[struct_pb2.Value]) -> struct_pb2.Value:
        out = struct_pb2.Value()
        out.list_value.SetInParent()
        for x in vs:
            out.list_value.values.add().CopyFrom(x)
        return out

    def to_struct(d: dict[str, struct_pb2.Value]) -> struct_pb2.Value:
        out = struct_pb2.Value()
        out.struct_value.SetInParent()
        for k, x in d.items():
            out.struct_value.fields[k].CopyFrom(x)
        return out

    tree = st.recursive(
        leaf(),
        lambda kids: st.one_of(
            st.lists(kids, max_size=4).map(to_list),
            st.dictionaries(
                st.sampled_from(["a", "b", "__rp", "", "x.y", "k"]), kids, max_size=3
            ).map(to_struct),
        ),
        max_leaves=8,
    )
    return st.one_of(tree, st.sampled_from([10, 60, max_depth]).map(deep_value))


def structs() -> st.SearchStrategy[struct_pb2.Struct]:
    def build(d: dict[str, struct_pb2.Value]) -> struct_pb2.Struct:
        s = struct_pb2.Struct()
        for k, v in d.items():
            s.fields[k].CopyFrom(v)
        return s

    keys = st.one_of(
        st.sampled_from(["kind", "year", "__rp", "", "a.b", "tags"]), st.text(max_size=6)
    )
    return st.dictionaries(keys, json_values(), max_size=4).map(build)


def _scalar(f: FieldDescriptor) -> st.SearchStrategy:
    t = f.type
    if t == F.TYPE_STRING:
        return strings()
    if t == F.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t == F.TYPE_FLOAT:
        return _floats(False)
    if t == F.TYPE_DOUBLE:
        return _floats(True)
    if t == F.TYPE_ENUM:
        known = [v.number for v in f.enum_type.values]
        return st.sampled_from(known + [-1, 99, 2**31 - 1])
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return st.one_of(st.sampled_from(INT32), st.integers(-(2**31), 2**31 - 1))
    if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return st.one_of(st.sampled_from(INT64), st.integers(-(2**63), 2**63 - 1))
    if t in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return st.sampled_from(UINT32)
    if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return st.sampled_from(UINT64)
    raise NotImplementedError(f"field type {t} of {f.full_name}")


def _repeated(f: FieldDescriptor, one: st.SearchStrategy) -> st.SearchStrategy[list]:
    lists = [st.lists(one, max_size=3)]
    if f.type == F.TYPE_FLOAT:
        # the fuzzed server's dims (64, 4) and off-by-one, plus one long vector
        for n in (4, 63, 64, 65):
            lists.append(st.lists(one, min_size=n, max_size=n))
        lists.append(st.lists(st.just(0.25), min_size=64, max_size=64))
        lists.append(st.just(5000).map(lambda n: [0.1] * n))
    elif f.type == F.TYPE_STRING:
        lists.append(st.just(3000).map(lambda n: [f"id{i}" for i in range(n)]))  # past the limit
        lists.append(st.just(["dup", "dup"]))
    elif f.type == F.TYPE_MESSAGE:
        lists.append(st.tuples(one, st.integers(20, 40)).map(lambda t: [t[0]] * t[1]))
    return st.one_of(*lists)


def messages(
    desc: Descriptor,
    overrides: Mapping[str, st.SearchStrategy] | None = None,
    depth: int = 0,
) -> st.SearchStrategy[Message]:
    """Messages of `desc` with fields set to extreme values; at most one member per oneof."""
    overrides = overrides or {}
    cls = GetMessageClass(desc)
    if desc.full_name == "google.protobuf.Struct":
        return structs()
    if desc.full_name == "google.protobuf.Value":
        return json_values()

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        chosen = {
            o.name: draw(st.sampled_from([None, *[f.name for f in o.fields]]))
            for o in desc.oneofs
            if not o.name.startswith("_")  # proto3 `optional` synthetic oneofs
        }
        for f in desc.fields:
            o = f.containing_oneof
            if o is not None and not o.name.startswith("_") and chosen[o.name] != f.name:
                continue
            if o is None or o.name.startswith("_"):
                if draw(st.integers(0, 4)) == 0:  # leave some fields unset
                    continue
            if f.full_name in overrides:
                one = overrides[f.full_name]
            elif f.type == F.TYPE_MESSAGE:
                if depth >= 4:
                    continue
                one = messages(f.message_type, overrides, depth + 1)
            else:
                one = _scalar(f)
            if f.is_repeated:
                if f.message_type is not None and f.message_type.GetOptions().map_entry:
                    continue  # no map fields in the API today
                values = draw(_repeated(f, one))
                target = getattr(msg, f.name)
                for v in values:
                    if f.type == F.TYPE_MESSAGE:
                        target.add().CopyFrom(v)
                    else:
                        target.append(v)
            elif f.type == F.TYPE_MESSAGE:
                getattr(msg, f.name).CopyFrom(draw(one))
            else:
                setattr(msg, f.name, draw(one))
        return msg

    return build()


# --- one field at a time ------------------------------------------------------------------


def nasty_values() -> list[struct_pb2.Value]:
    """JSON values that metadata and filter values must survive (or refuse cleanly)."""
    out = [
        struct_pb2.Value(number_value=float("nan")),
        struct_pb2.Value(number_value=float("inf")),
        struct_pb2.Value(number_value=float("-inf")),
        struct_pb2.Value(number_value=1e308),
        struct_pb2.Value(number_value=2.0**63),
        struct_pb2.Value(string_value="y" * 70_000),
        struct_pb2.Value(null_value=struct_pb2.NULL_VALUE),
        struct_pb2.Value(),  # kind unset
        deep_value(60),
        deep_value(120),  # past protobuf's recursion limit
    ]
    nested = struct_pb2.Value()
    nested.list_value.values.add(number_value=float("nan"))
    nested.list_value.values.add().struct_value.fields["x"].number_value = float("inf")
    out.append(nested)
    return out


def _field_values(f: FieldDescriptor) -> list:
    t = f.type
    if t == F.TYPE_STRING:
        return NAMES[:2] + ODD_STRINGS + [p[0] * p[1] for p in HUGE_STRINGS]
    if t == F.TYPE_BOOL:
        return [True, False]
    if t == F.TYPE_FLOAT:
        return FLOATS32
    if t == F.TYPE_DOUBLE:
        return FLOATS64
    if t == F.TYPE_ENUM:
        return [v.number for v in f.enum_type.values] + [-1, 99, 2**31 - 1]
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return INT32
    if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return INT64
    if t in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return UINT32
    if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return UINT64
    if t == F.TYPE_BYTES:
        return [b"", b"\xff" * 100]
    return []


def _repeated_values(f: FieldDescriptor) -> list[list]:
    if f.type == F.TYPE_FLOAT:
        return [
            [],
            [float("nan")] * 64,
            [float("inf")] * 64,
            [0.0] * 64,
            [3.4e38] * 64,
            [1.0] * 63,
            [1.0] * 65,
            [1.0] * 4,
            [0.1] * 5000,
        ]
    if f.type == F.TYPE_STRING:
        return [
            [],
            [""],
            ["dup", "dup"],
            ["x" * 2000],
            [f"id{i}" for i in range(3000)],
            ["a:b", "\x00"],
        ]
    return [[v] for v in _field_values(f)[:6]] + [[]]


def mutations(base: Message, depth: int = 0, path: str = ""):
    """Yield (path, message) pairs: `base` with exactly one field (at any depth) replaced by
    an extreme value, one oneof member chosen instead of another, or one field cleared.
    Everything else stays valid, so each case reaches the code behind the first check."""
    desc = base.DESCRIPTOR
    if desc.full_name == "google.protobuf.Struct":
        for i, v in enumerate(nasty_values()):
            for key in ("k", "__rp", ""):
                m = type(base)()
                m.CopyFrom(base)
                m.fields[key].CopyFrom(v)
                yield f"{path}[{key!r}]=nasty{i}", m
        return
    if desc.full_name == "google.protobuf.Value":
        for i, v in enumerate(nasty_values()):
            yield f"{path}=nasty{i}", v
        return

    def variant(edit) -> Message:
        m = type(base)()
        m.CopyFrom(base)
        edit(m)
        return m

    for f in desc.fields:
        p = f"{path}.{f.name}" if path else f.name
        yield f"{p} cleared", variant(lambda m, f=f: m.ClearField(f.name))
        if f.type == F.TYPE_MESSAGE:
            if depth >= 4 or (f.message_type.GetOptions().map_entry):
                continue
            if f.is_repeated:
                items = list(getattr(base, f.name))
                first = items[0] if items else GetMessageClass(f.message_type)()
                for sub_path, sub in mutations(first, depth + 1, f"{p}[0]"):

                    def put(m, f=f, sub=sub):
                        rep = getattr(m, f.name)
                        if len(rep):
                            rep[0].CopyFrom(sub)
                        else:
                            rep.add().CopyFrom(sub)

                    yield sub_path, variant(put)
                yield (
                    f"{p} x40",
                    variant(
                        lambda m, f=f, first=first: [
                            getattr(m, f.name).add().CopyFrom(first) for _ in range(40)
                        ]
                    ),
                )
            else:
                inner = (
                    getattr(base, f.name)
                    if base.HasField(f.name)
                    else (GetMessageClass(f.message_type)())
                )
                for sub_path, sub in mutations(inner, depth + 1, p):
                    yield (
                        sub_path,
                        variant(lambda m, f=f, sub=sub: getattr(m, f.name).CopyFrom(sub)),
                    )
        elif f.is_repeated:
            for vals in _repeated_values(f):

                def put(m, f=f, vals=vals):
                    m.ClearField(f.name)
                    getattr(m, f.name).extend(vals)

                yield f"{p}={_short(vals)}", variant(put)
        else:
            for v in _field_values(f):
                yield f"{p}={_short(v)}", variant(lambda m, f=f, v=v: setattr(m, f.name, v))


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else f"{r[:30]}...({len(r)} chars)"
