"""Kafka's wire protocol as `oncelog serve` speaks it: framing, headers and bodies.

A frame is an i32 size followed by that many bytes. A request starts with
api_key i16, api_version i16, correlation_id i32 (every header version agrees on
these), then the rest of its header and its body; a response starts with the
correlation id. Which header version a message uses (flexible or not) follows from
its API and version, as the generated schema classes record.

kio, generated from Kafka's JSON message specs, encodes and decodes every header
and body; nothing here hand-writes a struct. Record batches stay the bytes on the
wire: kio reads a `records` field as bytes, and a fetch response writes stored bytes,
as pieces of its frame that are never joined (encode_frame, Records).

What the caller decides: a frame that is malformed, or of an API or version the
registry (`api_registry`) neither serves nor advertises, raises MalformedRequestError and the
connection closes (Kafka closes it too); nothing has been touched.

Bytes left in a frame after the body are ignored, as Kafka ignores them: its broker
reads a request's fields from the frame and never checks what remains
(RequestContext.parseRequest, AbstractRequest.parseRequest). librdkafka relies on it:
2.16's all-topics Metadata v9 keeps the 4-byte placeholder of its topic count where a
1-byte varint goes, so 3 bytes follow the body. A body cut short is still malformed.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import struct
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from oncelog.server.fallback import without_unknown_tags
from oncelog.server.frame_bounds import check_body

# Kafka's socket.request.max.bytes: the largest request a broker reads.
MAX_REQUEST_BYTES: Final = 100 * 1024 * 1024
# The largest request decoded by kafka-python (fallback), which runs on the event loop at
# about 3 s a MiB and copies the rest of the frame for every tagged section: tagged
# fields kio lacks come in small requests (librdkafka's Metadata v9), versions below the
# served ones from old clients.
MAX_FALLBACK_FRAME_BYTES: Final = 64 * 1024
SIZE = struct.Struct(">i")
_HEADER_PREFIX = struct.Struct(">hhi")  # api_key, api_version, correlation_id
API_VERSIONS_KEY: Final = 18
SASL_HANDSHAKE_KEY: Final = 17
SASL_AUTHENTICATE_KEY: Final = 36
# isolation_level in Fetch and ListOffsets: 0 read_uncommitted, 1 read_committed.
READ_COMMITTED: Final = 1
# throttle_time in every response: this server never throttles.
NO_THROTTLE: Final = datetime.timedelta(0)
# Authorized operations when the request did not ask for them (Kafka's "omitted").
OPERATIONS_OMITTED: Final = -(2**31)


def milliseconds(delta: datetime.timedelta) -> int:
    """A duration field kio decodes as a timedelta (timeouts), in whole milliseconds."""
    return int(delta / datetime.timedelta(milliseconds=1))


class MalformedRequestError(Exception):
    """A frame this server cannot answer; the connection that sent it is closed."""


class ApiSpec(Protocol):
    """What decoding needs to know of an API: its name, its versions, its kafka-python twin.

    The registry (`oncelog.server.api_registry`) holds one per API, beside its handler."""

    @property
    def name(self) -> str: ...

    @property
    def fallback_request(self) -> Any | None:
        """kafka-python's request class, to decode a frame with tagged fields kio's spec lacks."""

    def serves(self, version: int) -> bool: ...

    def advertises(self, version: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    # The decoded body; None for a version advertised but not served (and for an
    # ApiVersions request at a version this table does not know).
    body: Any
    size_bytes: int
    # Bytes after the body, which were ignored.
    trailing_bytes: int = 0
    # The client's address, as Kafka names a member's host ("/127.0.0.1").
    client_host: str = ""
    # The connection's security state (oncelog.server.sasl.Session): its listener, its principal.
    session: Any = None


def frame_size(prefix: bytes) -> int:
    """The size a 4-byte frame prefix announces; MalformedRequestError if absurd."""
    assert len(prefix) == SIZE.size
    size: int = SIZE.unpack(prefix)[0]
    if not _HEADER_PREFIX.size <= size <= MAX_REQUEST_BYTES:
        raise MalformedRequestError(
            f"frame size {size} is outside [{_HEADER_PREFIX.size}, {MAX_REQUEST_BYTES}]"
        )
    return size


def decode_request(
    frame: bytes, apis: Mapping[int, ApiSpec], client_host: str = "", session: Any = None
) -> Request:
    """One request frame (without its size prefix), decoded; `apis`: what is served, by key;
    `client_host`: where it came from; `session`: its connection's security state."""
    if len(frame) < _HEADER_PREFIX.size:
        raise MalformedRequestError(f"a {len(frame)}-byte frame is shorter than a request header")
    api_key, api_version, correlation_id = _HEADER_PREFIX.unpack_from(frame)
    spec = apis.get(api_key)
    if spec is None:
        raise MalformedRequestError(f"unknown or unserved API key {api_key}")
    if not spec.serves(api_version):
        if api_key == API_VERSIONS_KEY or spec.advertises(api_version):
            # Answered without decoding: the header past the prefix may be in a layout
            # this codec does not know. ApiVersions answers in v0 (Kafka's rule).
            return Request(
                api_key, api_version, correlation_id, None, None, len(frame), 0, client_host, session
            )
        raise MalformedRequestError(f"{spec.name} v{api_version} is neither served nor advertised")
    request_type = _request_type(api_key, api_version)
    size_bytes = len(frame)
    try:
        header, offset, body, size = _kio_decode(request_type, frame)
    except KeyError as exc:
        if "tagged field" not in str(exc):
            raise _undecodable(spec, api_version, frame, exc) from exc
        # Tagged fields kio's spec lacks, which Kafka ignores: drop them and decode again.
        if spec.fallback_request is None:
            raise _undecodable(spec, api_version, frame, exc) from exc
        if len(frame) > MAX_FALLBACK_FRAME_BYTES:
            raise MalformedRequestError(
                f"{spec.name} v{api_version}: {len(frame)} bytes with tagged fields no spec names "
                f"(they are stripped from requests of at most {MAX_FALLBACK_FRAME_BYTES})"
            ) from exc
        try:
            frame = without_unknown_tags(spec.fallback_request, api_key, api_version, frame)
            header, offset, body, size = _kio_decode(request_type, frame)
        except Exception as again:  # kio raises several kinds on a short or garbled body
            raise _undecodable(spec, api_version, frame, again) from again
    except Exception as exc:
        raise _undecodable(spec, api_version, frame, exc) from exc
    trailing_bytes = len(frame) - offset - size
    if trailing_bytes < 0:
        raise MalformedRequestError(
            f"{spec.name} v{api_version} needs {-trailing_bytes} bytes past its frame"
        )
    return Request(
        api_key,
        api_version,
        correlation_id,
        header.client_id,
        body,
        size_bytes,
        trailing_bytes,
        client_host,
        session,
    )


def _kio_decode(request_type: type[Any], frame: bytes) -> tuple[Any, int, Any, int]:
    header, offset = entity_reader(request_type.__header_schema__)(frame, 0)  # (no arrays)
    # Before kio sees a count: it allocates what the frame claims, and a failed
    # allocation aborts the process (frame_bounds).
    check_body(request_type, frame, offset)
    body, size = entity_reader(request_type)(frame, offset)
    return header, offset, body, size


def _undecodable(spec: ApiSpec, api_version: int, frame: bytes, exc: BaseException) -> MalformedRequestError:
    return MalformedRequestError(
        f"{spec.name} v{api_version} does not decode: {exc!r} (frame starts {frame[:48].hex()})"
    )


def encode_response(request: Request, body: Any) -> bytes:
    """The response frame, size prefix included, answering `request` with `body`, in one piece."""
    return b"".join(encode_frame(request, body).pieces)


# -- frames as pieces: stored batches go out as they are held, never joined --------------


class Records:
    """A records field made of stored batch buffers, which the frame carries uncopied.

    kio writes a records field as its len() and then one write() of the value; the
    writer of encode_frame takes this value's views as pieces of the frame instead of
    copying them, so a 50 MB fetch response is the 50 MB its reads hold plus a header.
    """

    __slots__ = ("size_bytes", "views")

    def __init__(self, views: Sequence[memoryview]):
        self.views = list(views)
        self.size_bytes = sum(view.nbytes for view in self.views)

    def __len__(self) -> int:
        return self.size_bytes


@dataclass(frozen=True, slots=True)
class Frame:
    """A response frame, size prefix included, as the pieces to write in order."""

    pieces: list[bytes | memoryview]
    size_bytes: int
    # What keeping the frame keeps alive: its own bytes, and the whole of every buffer
    # its views are cut from (a view keeps all of its buffer).
    held_bytes: int

    @classmethod
    def of(cls, data: bytes) -> Frame:
        return cls([data], len(data), len(data))


class _PieceWriter:
    """What kio writes a frame into: bytes are gathered; a Records value becomes its views."""

    def __init__(self) -> None:
        self.pieces: list[bytes | memoryview] = []
        self._gathered = bytearray(SIZE.size)  # the size prefix, filled in last

    def write(self, data: Any) -> int:
        if isinstance(data, Records):
            self._close_gathered()
            self.pieces.extend(data.views)
        else:
            self._gathered += data
        return len(data)

    def _close_gathered(self) -> None:
        if self._gathered:
            self.pieces.append(bytes(self._gathered))
            self._gathered = bytearray()

    def frame(self) -> Frame:
        self._close_gathered()
        size = sum(len(piece) for piece in self.pieces)
        first = bytearray(self.pieces[0])
        SIZE.pack_into(first, 0, size - SIZE.size)
        self.pieces[0] = bytes(first)
        return Frame(self.pieces, size, held_bytes(self.pieces))


def held_bytes(pieces: Sequence[bytes | memoryview]) -> int:
    """The bytes `pieces` keep alive: each distinct buffer they are or are cut from, whole.

    A view of something other than bytes (a mapped file, say) counts only its own length:
    it holds no heap of its own.
    """
    held = 0
    buffers: dict[int, int] = {}
    for piece in pieces:
        source = buffer_of(piece)
        if source is None:
            held += len(piece)
        else:
            buffers[id(source)] = len(source)
    return held + sum(buffers.values())


def buffer_of(piece: bytes | memoryview) -> bytes | bytearray | None:
    """The heap buffer `piece` is or is cut from (which it keeps alive whole); None if not on the heap."""
    source = piece.obj if isinstance(piece, memoryview) else piece
    return source if isinstance(source, bytes | bytearray) else None


def encode_frame(request: Request, body: Any) -> Frame:
    """The response frame answering `request` with `body`; Records fields stay uncopied views."""
    header_type: type[Any] = type(body).__header_schema__
    pieces = _PieceWriter()
    writer = typing.cast(typing.IO[bytes], pieces)  # kio only ever calls write()
    entity_writer(header_type)(writer, header_type(correlation_id=request.correlation_id))
    entity_writer(type(body))(writer, body)
    return pieces.frame()


def response_type(api_key: int, api_version: int) -> type[Any]:
    """The generated response class of one API version."""
    return _response_type(api_key, api_version)


@functools.cache
def _request_type(api_key: int, api_version: int) -> type[Any]:
    return load_request_schema(api_key, api_version)


@functools.cache
def _response_type(api_key: int, api_version: int) -> type[Any]:
    return load_response_schema(api_key, api_version)


# -- building entities whatever the version --------------------------------------------
# A version's class has only the fields that version has; handlers pass every value
# they know and `build` keeps the ones this class holds, so one handler serves all
# versions. Absent values take the spec's defaults.


def build(entity_type: Any, **values: Any) -> Any:
    """An instance of a generated class from the values among `values` that it has."""
    names = _field_names(entity_type)
    return entity_type(**{name: value for name, value in values.items() if name in names})


def nested(entity_type: Any, field_name: str) -> type[Any]:
    """The generated class of a nested field (a struct or an array of structs)."""
    return _nested_types(entity_type)[field_name]


@functools.cache
def _field_names(entity_type: Any) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(entity_type))


@functools.cache
def _nested_types(entity_type: Any) -> dict[str, type[Any]]:
    found: dict[str, type[Any]] = {}
    for name, hint in typing.get_type_hints(entity_type).items():
        candidates = [hint, *typing.get_args(hint)]
        for candidate in list(candidates):
            candidates.extend(typing.get_args(candidate))
        for candidate in candidates:
            if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
                found[name] = candidate
                break
    return found
