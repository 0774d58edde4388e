"""Every length and count in a request body fits in its frame, checked before kio decodes it.

kio's decoder is native (Rust). It sizes an array from the count the frame claims, before
reading any element: a 57-byte Metadata request claiming 2^31 - 1 topics asks for 16 GiB,
and a failed allocation in Rust aborts the whole process, which no `except` can catch.
One peer could stop the broker for every client. Kafka's own parser checks each count
against the bytes left (it throws on a negative or oversized one) before allocating.

So the body is walked first, field by field, by the same generated schema kio decodes
with, reading only lengths and counts:

- an array of N elements needs at least N bytes left (every element is at least one
  byte on the wire); of a fixed-size type, N times its size;
- a string, bytes or records field needs its length left;
- a tagged field's size must fit, and a known tag's value is walked inside its size.

Nothing is decoded or built: a Produce request of one topic and partition is a dozen
reads. What passes may still fail kio's decode (a bad UTF-8 string, an unknown tag):
that is a MalformedRequestError as before, raised by kio without allocating past the frame.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from dataclasses import dataclass
from typing import Any, Final

# Sizes on the wire of kio's fixed-size kafka_type names.
FIXED_BYTES: Final[dict[str, int]] = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "datetime_i64": 8,
    "timedelta_i64": 8,
    "float64": 8,
    "uuid": 16,
}
STRING_TYPES: Final = frozenset({"string"})
BYTES_TYPES: Final = frozenset({"bytes", "records"})
# More tagged fields than kio knows than this refuse the request: the fallback that strips
# them (kafka-python) copies the rest of the frame for each. librdkafka sends one.
MAX_UNKNOWN_TAGS: Final = 64
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_MAX_VARINT_BYTES = 5  # an unsigned varint of 32 bits


class FrameBoundsError(ValueError):
    """A length or count in the frame reaches past its end (or is negative where none may be)."""


# What a field is on the wire (FieldPlan.kind).
FIXED, STRING, BYTES, ENTITY = range(4)


@dataclass(frozen=True, slots=True)
class FieldPlan:
    name: str
    kind: int
    fixed_bytes: int  # of a FIXED field; 0 otherwise
    is_array: bool
    entity: EntityPlan | None


@dataclass(frozen=True, slots=True)
class EntityPlan:
    name: str
    flexible: bool
    fields: tuple[FieldPlan, ...]  # untagged, in wire order
    tagged: dict[int, FieldPlan]


@functools.cache
def plan_of(entity_type: Any) -> EntityPlan:
    """The walk of one generated kio entity class (cached: one per class, made once)."""
    fields: list[FieldPlan] = []
    tagged: dict[int, FieldPlan] = {}
    for field in dataclasses.fields(entity_type):
        inner, is_array = _element_type(field.type)
        if dataclasses.is_dataclass(inner):
            plan = FieldPlan(field.name, ENTITY, 0, is_array, plan_of(inner))  # type: ignore[arg-type]
        else:
            kafka_type = str(field.metadata["kafka_type"])
            if kafka_type in FIXED_BYTES:
                plan = FieldPlan(field.name, FIXED, FIXED_BYTES[kafka_type], is_array, None)
            elif kafka_type in STRING_TYPES or kafka_type in BYTES_TYPES:
                kind = STRING if kafka_type in STRING_TYPES else BYTES
                plan = FieldPlan(field.name, kind, 0, is_array, None)
            else:
                raise TypeError(f"{entity_type.__name__}.{field.name}: unknown kafka_type {kafka_type!r}")
        tag = field.metadata.get("tag")
        if tag is None:
            fields.append(plan)
        else:
            tagged[int(tag)] = plan
    return EntityPlan(entity_type.__name__, bool(entity_type.__flexible__), tuple(fields), tagged)


def _element_type(annotation: Any) -> tuple[Any, bool]:
    """(the element type, whether the field is an array) of a kio field annotation."""
    args: tuple[Any, ...] = tuple(getattr(annotation, "__args__", ()))
    if getattr(annotation, "__origin__", None) is tuple:
        return _element_type(args[0])[0], True
    if args and type(None) in args:  # X | None
        (inner,) = [arg for arg in args if arg is not type(None)]
        return _element_type(inner)
    return annotation, False


def check_body(entity_type: Any, frame: bytes, start: int) -> int:
    """Walk the body of `entity_type` at `start` to its end, which is returned; FrameBoundsError
    if any length or count reaches past the frame."""
    return _Walk(memoryview(frame)).entity(plan_of(entity_type), start, len(frame))


class _Walk:
    """The walk itself. Messages are built only on the way out: the common frame builds none."""

    def __init__(self, view: memoryview):
        self.view = view
        self.unknown_tags = 0

    def entity(self, plan: EntityPlan, at: int, end: int) -> int:
        for field in plan.fields:
            if field.is_array:
                at = self.field(field, plan, at, end)
            elif field.kind == FIXED:
                at += field.fixed_bytes  # (checked below, and by every read before a later one)
            else:
                at = self.value(field, plan, at, end)
        if at > end:
            raise FrameBoundsError(f"{plan.name}: its fields reach byte {at}, past the frame's end at {end}")
        if plan.flexible:
            at = self.tags(plan, at, end)
        return at

    def field(self, field: FieldPlan, owner: EntityPlan, at: int, end: int) -> int:
        """An array field (or a tagged field's value, which may be one)."""
        if not field.is_array:
            return self.value(field, owner, at, end)
        count, at = self.length(owner, field, _I32, at, end)
        if count < 0:
            return at  # null
        left = end - at
        if count > left or count * field.fixed_bytes > left:
            raise FrameBoundsError(
                f"{owner.name}.{field.name}: {count} elements claimed, {left} bytes left at byte {at}"
            )
        if field.kind == FIXED:
            return at + count * field.fixed_bytes
        for _ in range(count):
            at = self.value(field, owner, at, end)
        return at

    def value(self, field: FieldPlan, owner: EntityPlan, at: int, end: int) -> int:
        kind = field.kind
        if kind == ENTITY:
            assert field.entity is not None
            return self.entity(field.entity, at, end)
        if kind == FIXED:
            size = field.fixed_bytes
        else:
            size, at = self.length(owner, field, _I16 if kind == STRING else _I32, at, end)
            size = max(size, 0)  # -1: null
        if size > end - at:
            raise FrameBoundsError(
                f"{owner.name}.{field.name}: {size} bytes claimed, {end - at} left at byte {at}"
            )
        return at + size

    def tags(self, plan: EntityPlan, at: int, end: int) -> int:
        count, at = self.uvarint(at, end, plan.name)
        if count > end - at:
            raise FrameBoundsError(f"{plan.name}: {count} tagged fields claimed, {end - at} bytes left")
        for _ in range(count):
            tag, at = self.uvarint(at, end, plan.name)
            size, at = self.uvarint(at, end, plan.name)
            if size > end - at:
                raise FrameBoundsError(f"{plan.name} tag {tag}: {size} bytes claimed, {end - at} left")
            field = plan.tagged.get(tag)
            if field is None:  # kio refuses it (allocating nothing); the fallback strips it
                self.unknown_tags += 1
                if self.unknown_tags > MAX_UNKNOWN_TAGS:
                    raise FrameBoundsError(f"more than {MAX_UNKNOWN_TAGS} tagged fields no spec names")
            elif self.field(field, plan, at, at + size) != at + size:
                # kio reads the value and goes on from its end, not from the size's: bytes
                # between would be read by kio unwalked.
                raise FrameBoundsError(f"{plan.name} tag {tag}: its value does not fill its {size} bytes")
            at += size
        return at

    def length(
        self, owner: EntityPlan, field: FieldPlan, width: struct.Struct, at: int, end: int
    ) -> tuple[int, int]:
        """A length or count: a compact one (varint, plus one; 0 is null) or a fixed-width one (-1 null)."""
        if owner.flexible:
            raw, at = self.uvarint(at, end, owner.name)
            return raw - 1, at
        if at + width.size > end:
            raise FrameBoundsError(f"{owner.name}.{field.name}: the frame ends at byte {end}")
        (value,) = width.unpack_from(self.view, at)
        if value < -1:
            raise FrameBoundsError(f"{owner.name}.{field.name}: {value} is negative")
        return int(value), at + width.size

    def uvarint(self, at: int, end: int, where: str) -> tuple[int, int]:
        view = self.view
        if at < end and view[at] < 0x80:
            return view[at], at + 1  # (nearly every one: lengths and counts below 128)
        value = shift = 0
        for n in range(at, min(at + _MAX_VARINT_BYTES, end)):
            byte = view[n]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, n + 1
            shift += 7
        if end - at < _MAX_VARINT_BYTES:
            raise FrameBoundsError(f"{where}: the frame ends inside a varint at byte {end}")
        raise FrameBoundsError(f"{where}: a varint longer than {_MAX_VARINT_BYTES} bytes at byte {at}")
