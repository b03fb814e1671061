"""A pickle read opcode by opcode, never run: plain values and numpy's numeric arrays.

``pickle.load`` builds whatever a file names, and even an allowlist of numpy's
own names is not safe: a dtype's pickled state can clear the flag that makes
numpy refuse raw bytes for an object array, and the bytes then become
pointers.  This reader walks the opcodes (``pickle_opcodes``) and
builds only None, bools, ints, floats, str, bytes (a Python 2 string as
bytes, as ``pickle.load(..., encoding="bytes")`` gives it), tuples, lists and
dicts; numpy arrays and scalars of a plain numeric dtype (bool, int, uint,
float, complex), from the forms numpy pickles them in; and protocol 2's bytes
(``_codecs.encode(text, "latin1")``).  An array's bytes are checked against
its shape before anything is allocated, so nothing built is larger than the
bytes it came from (the memo is a dict: pickle's own C unpickler sizes its
memo from an index the file gives, gigabytes for a 10-byte file).  Anything
else raises ``pickle.UnpicklingError`` naming the opcode and its byte offset.
"""

from __future__ import annotations

import pickle
import re
from typing import Any, NoReturn

import numpy as np

from .pickle_opcodes import opcodes

__all__ = ["read_plain_pickle"]

# (module, name) a pickle may name -> what it stands for here; nothing is imported.
_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): "reconstruct",
    ("numpy._core.multiarray", "_reconstruct"): "reconstruct",
    ("numpy", "ndarray"): "ndarray",
    ("numpy", "dtype"): "dtype",
    ("numpy.core.multiarray", "scalar"): "scalar",
    ("numpy._core.multiarray", "scalar"): "scalar",
    ("numpy.core.numeric", "_frombuffer"): "frombuffer",
    ("numpy._core.numeric", "_frombuffer"): "frombuffer",
    ("_codecs", "encode"): "encode",
    ("__builtin__", "bytes"): "bytes",
    ("builtins", "bytes"): "bytes",
}
# A plain numeric dtype as numpy's pickle names it: kind letter, item size.
_NUMERIC_CODE = re.compile(r"[biufc][0-9]{1,2}")
_MAX_DIMS = 64  # numpy's own limit


class _Global:
    """A name from ``_GLOBALS``, standing on the stack until a REDUCE applies it."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind


class _Dtype:
    """``numpy.dtype(code)`` of a plain numeric code; its BUILD may set only the byte order."""

    __slots__ = ("dtype", "built")

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype, self.built = dtype, False


class _Array:
    """``_reconstruct(ndarray, (0,), b"b")``: an array whose BUILD gives shape, dtype and bytes."""

    __slots__ = ("array",)

    def __init__(self) -> None:
        self.array: np.ndarray | None = None


_SYMBOLS = (_Global, _Dtype, _Array)


def _refuse(message: str) -> NoReturn:
    raise pickle.UnpicklingError(message)


def _equal(value: Any, expected: Any) -> bool:
    """``value == expected`` with the types equal too, element by element in a tuple, so an
    array standing where a plain value is expected is refused instead of compared."""
    if type(expected) is tuple:
        return type(value) is tuple and len(value) == len(expected) \
            and all(_equal(v, e) for v, e in zip(value, expected))
    return type(value) is type(expected) and value == expected


def _flag(value: Any) -> bool:
    """A bool as numpy writes it: True/False, or 0/1 from Python 2."""
    return type(value) in (bool, int) and value in (0, 1)


def _brief(value: Any, depth: int = 0) -> str:
    """A short description of a value for a message; never the whole of a large bytes."""
    if type(value) is tuple and depth < 3:
        inner = ", ".join(_brief(v, depth + 1) for v in value[:9])
        return f"({inner}{', ...' if len(value) > 9 else ''}{',' if len(value) == 1 else ''})"
    if isinstance(value, (str, bytes, bytearray)):
        return repr(value[:24]) + (f"... ({len(value)} long)" if len(value) > 24 else "")
    if value is None or type(value) in (bool, float) or (type(value) is int
                                                         and value.bit_length() < 64):
        return repr(value)
    return type(value).__name__.strip("_")


def _text(value: Any, what: str) -> str:
    """A str, or a Python 2 string (bytes here) read as latin-1, as numpy's own pickles hold."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if not isinstance(value, str):
        _refuse(f"{what} must be a string, found {type(value).__name__}")
    return value


def _numeric_dtype(code: Any) -> _Dtype:
    code = _text(code, "a dtype's code")
    if not _NUMERIC_CODE.fullmatch(code):
        _refuse(f"dtype {code!r} is not a plain numeric dtype (bool, int, uint, float, complex)")
    try:
        dtype = np.dtype(code)
    except TypeError:
        _refuse(f"dtype {code!r} is not a numpy dtype")
    if dtype.kind != code[0] or dtype.itemsize != int(code[1:]) or dtype.fields is not None \
            or dtype.subdtype is not None or dtype.hasobject:
        _refuse(f"dtype {code!r} is not a plain numeric dtype")
    return _Dtype(dtype)


def _build_dtype(pending: _Dtype, state: Any) -> None:
    """Accept only the state a plain numeric dtype pickles: version 3, a byte order, no
    fields, no subarray, no flags (the flags are what would let bytes be read as objects)."""
    if pending.built:
        _refuse("a dtype's state is set twice")
    if type(state) is not tuple or len(state) != 8 or not _equal(state[0], 3) \
            or not _equal(state[2:], (None, None, None, -1, -1, 0)):
        _refuse(f"dtype state {_brief(state)} is not a plain numeric dtype's")
    order = _text(state[1], "a dtype's byte order")
    if order not in ("<", ">", "|", "="):
        _refuse(f"dtype byte order {order!r} is not one of <, >, |, =")
    if order in "<>" and pending.dtype.itemsize > 1:
        pending.dtype = pending.dtype.newbyteorder(order)
    pending.built = True


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, tuple) or len(value) > _MAX_DIMS or not all(
            type(d) is int and d >= 0 for d in value):
        _refuse(f"array shape {_brief(value)} is not a tuple of at most {_MAX_DIMS} "
                f"non-negative ints")
    return value


def _array(shape: Any, pending: Any, raw: Any, order: str, native: bool = False) -> np.ndarray:
    """The array of ``shape`` and ``pending``'s dtype over ``raw``, copied (to native byte
    order if ``native``, as ``ndarray.__setstate__`` does); its size is checked against
    ``raw`` first, so a shape cannot claim more than the file holds."""
    shape = _shape(shape)
    if not isinstance(pending, _Dtype):
        _refuse(f"an array's dtype must be a numpy.dtype, found {type(pending).__name__}")
    if not isinstance(raw, (bytes, bytearray)):
        _refuse(f"an array's data must be bytes, found {type(raw).__name__} (an object array?)")
    count = 1
    for d in shape:
        count *= d
    needed = count * pending.dtype.itemsize
    if needed != len(raw):
        _refuse(f"an array of shape {shape} and dtype {pending.dtype} needs {needed} bytes, "
                f"the pickle holds {len(raw)}")
    flat = np.frombuffer(raw, dtype=pending.dtype, count=count)
    dtype = pending.dtype.newbyteorder("=") if native else pending.dtype
    return np.array(flat.reshape(shape, order=order), dtype=dtype, copy=True, order="K")


def _build_array(pending: _Array, state: Any) -> np.ndarray:
    """``ndarray.__setstate__``'s state as numpy writes it: (1, shape, dtype, fortran, bytes)."""
    if pending.array is not None:
        _refuse("an array's state is set twice")
    if type(state) is not tuple or len(state) != 5 or not _equal(state[0], 1) \
            or not _flag(state[3]):
        _refuse(f"array state {_brief(state)} is not numpy's (1, shape, dtype, fortran, bytes)")
    pending.array = _array(state[1], state[2], state[4], "F" if state[3] else "C", native=True)
    return pending.array


def _reduce(function: Any, args: Any) -> Any:
    """What a REDUCE of one of ``_GLOBALS`` gives, each form checked."""
    if not isinstance(function, _Global) or not isinstance(args, tuple):
        _refuse("REDUCE of something other than an allowed global")
    kind = function.kind
    if kind == "encode" and len(args) == 2 and type(args[0]) is str \
            and (_equal(args[1], "latin1") or _equal(args[1], "latin-1")):
        return args[0].encode("latin-1")
    if kind == "bytes" and args == ():
        return b""
    if kind == "dtype" and len(args) == 3 and _flag(args[1]) and _flag(args[2]):
        return _numeric_dtype(args[0])
    if kind == "reconstruct" and len(args) == 3 and isinstance(args[0], _Global) \
            and args[0].kind == "ndarray" and _equal(args[1], (0,)) \
            and (_equal(args[2], b"b") or _equal(args[2], "b")):
        return _Array()
    if kind == "scalar" and len(args) == 2:
        return _array((), args[0], args[1], "C")[()]
    if kind == "frombuffer" and len(args) == 4 and (_equal(args[3], "C") or _equal(args[3], "F")):
        return _array(args[2], args[1], args[0], args[3])
    _refuse(f"REDUCE of {kind} with arguments {_brief(args)} is not a form numpy or pickle "
            f"writes for plain values")


def _value(obj: Any) -> Any:
    """``obj`` as it may go into a list or dict: a built array, never a symbol."""
    if isinstance(obj, _Array) and obj.array is not None:
        return obj.array
    if isinstance(obj, _SYMBOLS):
        _refuse(f"a {type(obj).__name__.strip('_').lower()} that is not a complete value "
                f"is used as one")
    return obj


class _Machine:
    """The pickle virtual machine for plain values: a stack, marks and a memo."""

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}

    def pop_mark(self) -> list[Any]:
        items, self.stack = self.stack, self.marks.pop()
        return items

    def run(self, name: str, arg: Any) -> None:
        stack = self.stack
        if name in _PUSH_ARG:
            stack.append(arg)
        elif name in _CONSTANTS:
            stack.append(_CONSTANTS[name]())
        elif name == "MARK":
            self.marks.append(stack)
            self.stack = []
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "POP":
            stack.pop()
        elif name == "DUP":
            stack.append(stack[-1])
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            self.memo[len(self.memo) if name == "MEMOIZE" else arg] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            found = self.memo[arg]
            stack.append(found.array if isinstance(found, _Array) and found.array is not None
                         else found)
        elif name in _CONTAINERS:
            self.run_container(name)
        else:
            self.run_call(name, arg)

    def run_container(self, name: str) -> None:
        if name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            if len(self.stack) < n:
                _refuse("stack underflow")
            items = tuple(self.stack[-n:])
            del self.stack[-n:]
            self.stack.append(items)
        elif name in ("TUPLE", "LIST"):
            items = self.pop_mark()
            self.stack.append(tuple(items) if name == "TUPLE" else [_value(v) for v in items])
        elif name in ("APPEND", "APPENDS"):
            items = [self.stack.pop()] if name == "APPEND" else self.pop_mark()
            target = self.stack[-1]
            if type(target) is not list:
                _refuse(f"{name} to a {type(target).__name__}, not a list")
            target.extend(_value(v) for v in items)
        else:  # DICT, SETITEM, SETITEMS
            if name == "SETITEM":
                items = self.stack[-2:]
                del self.stack[-2:]
            else:
                items = self.pop_mark()
            if len(items) % 2:
                _refuse(f"{name} with a key and no value")
            target = {} if name == "DICT" else self.stack[-1]
            if type(target) is not dict:
                _refuse(f"{name} on a {type(target).__name__}, not a dict")
            for i in range(0, len(items), 2):
                target[_value(items[i])] = _value(items[i + 1])
            if name == "DICT":
                self.stack.append(target)

    def run_call(self, name: str, arg: Any) -> None:
        stack = self.stack
        if name in ("GLOBAL", "STACK_GLOBAL"):
            if name == "GLOBAL":
                module, _, attr = arg.partition(" ")
            else:
                attr, module = stack.pop(), stack.pop()
            kind = _GLOBALS.get((module, attr)) if type(module) is str \
                and type(attr) is str else None
            if kind is None:
                _refuse(f"refusing global {module}.{attr}: only numpy's numeric arrays and "
                        f"plain Python values may be read")
            stack.append(_Global(kind))
        elif name == "REDUCE":
            args = stack.pop()
            stack[-1] = _reduce(stack[-1], args)
        elif name == "BUILD":
            state, target = stack.pop(), stack[-1]
            if isinstance(target, _Dtype):
                _build_dtype(target, state)
            elif isinstance(target, _Array):
                stack[-1] = _build_array(target, state)
            else:
                _refuse(f"BUILD of a {type(target).__name__}: only numpy dtypes and arrays "
                        f"take a state here")
        else:
            _refuse(f"opcode {name} builds objects this reader does not make")


# Opcodes whose argument is the value itself (Python 2's strings as bytes).
_PUSH_ARG = frozenset({
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
    "STRING", "BINSTRING", "SHORT_BINSTRING"})
_CONSTANTS = {"NONE": lambda: None, "NEWTRUE": lambda: True, "NEWFALSE": lambda: False,
              "EMPTY_TUPLE": tuple, "EMPTY_LIST": list, "EMPTY_DICT": dict}
_CONTAINERS = frozenset({"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "LIST", "APPEND", "APPENDS",
                         "DICT", "SETITEM", "SETITEMS"})
_IGNORED = frozenset({"PROTO", "FRAME"})


def _check_plain(result: Any) -> None:
    """Refuse a result that still holds a symbol (inside a tuple, where REDUCE's arguments
    may legitimately have them); iterative, so deep nesting cannot exhaust the C stack."""
    seen, todo = set(), [result]
    while todo:
        obj = todo.pop()
        if isinstance(obj, _SYMBOLS):
            _refuse(f"a {type(obj).__name__.strip('_').lower()} inside a tuple is not a value "
                    f"this reader makes")
        if isinstance(obj, (list, tuple, dict)) and id(obj) not in seen:
            seen.add(id(obj))  # every container stays alive in the result: ids stay unique
            todo.extend(obj)
            if isinstance(obj, dict):
                todo.extend(obj.values())


def read_plain_pickle(data: bytes) -> Any:
    """The value a pickle holds, if it is made only of plain values and numeric arrays.

    Raises ``pickle.UnpicklingError`` for anything else, for a malformed or
    truncated pickle, and for an array whose bytes disagree with its shape.
    """
    machine = _Machine()
    for name, arg, pos in opcodes(data):
        if name == "STOP":
            if machine.marks or len(machine.stack) != 1:
                _refuse(f"byte {pos}: STOP with a stack that does not hold exactly one value")
            result = _value(machine.stack[0])
            _check_plain(result)
            return result
        if name in _IGNORED:
            continue
        try:
            machine.run(name, arg)
        except (IndexError, KeyError, ValueError) as error:
            _refuse(f"byte {pos}: {name}: malformed pickle ({type(error).__name__}: {error})")
        except TypeError as error:  # an unhashable dict key
            _refuse(f"byte {pos}: {name}: {error}")
        except pickle.UnpicklingError as error:
            _refuse(f"byte {pos}: {name}: {error}")
    raise AssertionError("opcodes() ends with STOP or raises")
