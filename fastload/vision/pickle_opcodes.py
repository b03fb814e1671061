"""A pickle's opcodes and their arguments, read from bytes without running anything.

``opcodes(data)`` yields ``(name, argument, offset)`` for each opcode up to
``STOP``, with the names ``pickletools`` gives them.  Every length is checked
against the bytes that remain before anything is sliced, so a length field
cannot make the reader allocate more than the file holds.  Python 2's byte
strings (``STRING``, ``BINSTRING``, ``SHORT_BINSTRING``) come out as bytes, as
``pickle.load(..., encoding="bytes")`` gives them.  The opcodes that only
persistent ids, the extension registry or out-of-band buffers give meaning
to are not read at all.  A malformed or truncated pickle raises
``pickle.UnpicklingError`` naming the offset.
"""

from __future__ import annotations

import codecs
import pickle
import struct
from collections.abc import Iterator
from typing import Any, NoReturn

__all__ = ["opcodes"]

_UINT2, _INT4, _UINT4, _UINT8 = struct.Struct("<H"), struct.Struct("<i"), struct.Struct("<I"), \
    struct.Struct("<Q")
_FLOAT8 = struct.Struct(">d")


def _fail(message: str, pos: int) -> NoReturn:
    raise pickle.UnpicklingError(f"byte {pos}: {message}")


def _take(data: bytes, pos: int, count: int) -> bytes:
    if count < 0 or pos + count > len(data):
        _fail(f"truncated pickle: {count} bytes needed, {len(data) - pos} remain", pos)
    return data[pos:pos + count]


def _line(data: bytes, pos: int) -> bytes:
    end = data.find(b"\n", pos)
    if end < 0:
        _fail("truncated pickle: no end of line", pos)
    return data[pos:end]


def _decimal(line: bytes, pos: int) -> int:
    try:
        return int(line)
    except ValueError:
        _fail(f"not a decimal integer: {line[:40]!r}", pos)


def _text_argument(code: int, data: bytes, pos: int) -> tuple[Any, int]:
    """The argument of a protocol 0 opcode: one line (two for GLOBAL)."""
    line = _line(data, pos)
    end = pos + len(line) + 1
    if code == 0x49:  # INT; "00" and "01" are False and True
        if line in (b"00", b"01"):
            return line == b"01", end
        return _decimal(line, pos), end
    if code == 0x4C:  # LONG
        return _decimal(line[:-1] if line.endswith(b"L") else line, pos), end
    if code in (0x70, 0x67):  # PUT, GET
        return _decimal(line, pos), end
    if code == 0x46:  # FLOAT
        try:
            return float(line), end
        except ValueError:
            _fail(f"not a float: {line[:40]!r}", pos)
    try:
        if code == 0x53:  # STRING: a quoted, escaped Python 2 string
            if len(line) < 2 or line[:1] not in (b"'", b'"') or line[-1:] != line[:1]:
                _fail("STRING without its quotes", pos)
            return codecs.escape_decode(line[1:-1])[0], end
        if code == 0x56:  # UNICODE
            return str(line, "raw-unicode-escape"), end
        name = _line(data, end)  # GLOBAL: module line, then name line
        return f"{line.decode('utf-8')} {name.decode('utf-8')}", end + len(name) + 1
    except (UnicodeDecodeError, ValueError) as error:
        _fail(f"undecodable text argument ({error})", pos)


def _counted(data: bytes, pos: int, size: Any) -> tuple[bytes, int]:
    """A length field read with ``size`` (a struct, or 1 for one byte), then that many bytes."""
    if size == 1:
        count = _take(data, pos, 1)[0]
        pos += 1
    else:
        count = size.unpack(_take(data, pos, size.size))[0]
        pos += size.size
    return _take(data, pos, count), pos + count


def _fixed(data: bytes, pos: int, size: Any) -> tuple[Any, int]:
    if size == 1:
        return _take(data, pos, 1)[0], pos + 1
    return size.unpack(_take(data, pos, size.size))[0], pos + size.size


def _utf8(raw: bytes, pos: int) -> str:
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as error:
        _fail(f"undecodable text ({error})", pos)


# opcode byte -> (pickletools' name, how its argument is stored)
_OPCODES = {
    0x80: ("PROTO", "u1"), 0x95: ("FRAME", "u8"), 0x2E: ("STOP", None),
    0x4E: ("NONE", None), 0x88: ("NEWTRUE", None), 0x89: ("NEWFALSE", None),
    0x4B: ("BININT1", "u1"), 0x4D: ("BININT2", "u2"), 0x4A: ("BININT", "i4"),
    0x8A: ("LONG1", "long1"), 0x8B: ("LONG4", "long4"), 0x47: ("BINFLOAT", "f8"),
    0x49: ("INT", "text"), 0x4C: ("LONG", "text"), 0x46: ("FLOAT", "text"),
    0x53: ("STRING", "text"), 0x56: ("UNICODE", "text"), 0x63: ("GLOBAL", "text"),
    0x70: ("PUT", "text"), 0x67: ("GET", "text"),
    0x55: ("SHORT_BINSTRING", "bytes1"), 0x54: ("BINSTRING", "bytes4s"),
    0x43: ("SHORT_BINBYTES", "bytes1"), 0x42: ("BINBYTES", "bytes4"),
    0x8E: ("BINBYTES8", "bytes8"), 0x96: ("BYTEARRAY8", "bytes8"),
    0x8C: ("SHORT_BINUNICODE", "utf1"), 0x58: ("BINUNICODE", "utf4"),
    0x8D: ("BINUNICODE8", "utf8"),
    0x7D: ("EMPTY_DICT", None), 0x5D: ("EMPTY_LIST", None), 0x29: ("EMPTY_TUPLE", None),
    0x28: ("MARK", None), 0x74: ("TUPLE", None), 0x85: ("TUPLE1", None),
    0x86: ("TUPLE2", None), 0x87: ("TUPLE3", None), 0x6C: ("LIST", None),
    0x64: ("DICT", None), 0x61: ("APPEND", None), 0x65: ("APPENDS", None),
    0x73: ("SETITEM", None), 0x75: ("SETITEMS", None),
    0x30: ("POP", None), 0x31: ("POP_MARK", None), 0x32: ("DUP", None),
    0x71: ("BINPUT", "u1"), 0x72: ("LONG_BINPUT", "u4"), 0x94: ("MEMOIZE", None),
    0x68: ("BINGET", "u1"), 0x6A: ("LONG_BINGET", "u4"),
    0x93: ("STACK_GLOBAL", None), 0x52: ("REDUCE", None), 0x62: ("BUILD", None),
    # Read so that the reader can name them when it refuses them.
    0x81: ("NEWOBJ", None), 0x92: ("NEWOBJ_EX", None), 0x6F: ("OBJ", None),
    0x69: ("INST", "text"), 0x8F: ("EMPTY_SET", None), 0x90: ("ADDITEMS", None),
    0x91: ("FROZENSET", None),
}
_FIXED = {"u1": 1, "u2": _UINT2, "i4": _INT4, "u4": _UINT4, "u8": _UINT8, "f8": _FLOAT8}
_COUNTED = {"bytes1": 1, "bytes4": _UINT4, "bytes4s": _INT4, "bytes8": _UINT8,
            "utf1": 1, "utf4": _UINT4, "utf8": _UINT8, "long1": 1, "long4": _INT4}


def opcodes(data: bytes) -> Iterator[tuple[str, Any, int]]:
    """``(name, argument, offset)`` of each opcode of the pickle in ``data``, STOP last."""
    pos, size = 0, len(data)
    while pos < size:
        start, code = pos, data[pos]
        if code not in _OPCODES:
            _fail(f"opcode {bytes([code])!r} is not one this reader knows", start)
        name, kind = _OPCODES[code]
        pos += 1
        arg = None
        if kind == "u1" and pos < size:  # the commonest (BININT1, BINPUT, BINGET), inline
            arg = data[pos]
            pos += 1
        elif kind in _FIXED:
            arg, pos = _fixed(data, pos, _FIXED[kind])
        elif kind in _COUNTED:
            raw, pos = _counted(data, pos, _COUNTED[kind])
            if kind.startswith("utf"):
                arg = _utf8(raw, start)
            elif kind.startswith("long"):
                arg = int.from_bytes(raw, "little", signed=True)
            else:
                arg = bytearray(raw) if name == "BYTEARRAY8" else raw
        elif kind == "text":
            arg, pos = _text_argument(code, data, pos)
        yield name, arg, start
        if name == "STOP":
            return
    _fail("truncated pickle: no STOP opcode", pos)
