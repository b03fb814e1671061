"""Which loader made a cached image: an identity that changes whenever its pixels can.

The decoded-image cache keys each entry on the file, ``cache_max_side``,
``cache_format``, the checksum in use, and the loader.  A type name does not
tell loaders apart (every ``functools.partial`` is "functools.partial", every
lambda "<module>.<lambda>"), so ``loader_identity`` describes the loader by
what decides its output:

* ``functools.partial``: its function, positional arguments and keywords,
  each described in turn;
* a Python function (a lambda too): its module and qualified name, its code
  (bytecode, constants, the names it uses, nested code alike; not its file or
  line numbers), its defaults, the contents of its closure cells, and the
  globals its code reads (a function of the same module described in full,
  one of another module by its name);
* a module, a class, or a builtin function, by the importable name that finds
  that very object;
* values: None, bool, int, float, complex, str, bytes, Ellipsis, enum
  members, numpy scalars, and tuples and frozensets of them.

Anything else (a callable object, a closure over a list or a dict, a global
holding an arbitrary object, a builtin bound to an object) has no identity
the cache can trust: ``UnidentifiedLoader`` says what it met, and the cache
loads that loader's images uncached unless ``cache_key=`` names it.
"""

from __future__ import annotations

import dis
import enum
import functools
import hashlib
import importlib
import types
from typing import Any

import numpy as np

from .decode import default_loader, pil_loader

__all__ = ["UnidentifiedLoader", "key_for_loader", "loader_identity"]

_MAX_DEPTH = 24
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"})
_SCALARS = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))


class UnidentifiedLoader(Exception):
    """The loader (or something it depends on) has no identity the cache can trust."""


def key_for_loader(loader: Any, user_key: str | None) -> bytes:
    """What stands for ``loader`` in its entries' keys: the user's ``cache_key`` when
    given (whatever the loader), the default loader's name, or ``loader_identity``."""
    if user_key is not None:
        return b"user\0" + user_key.encode("utf-8", "surrogatepass")
    if loader is default_loader or loader is pil_loader:
        # Both give the file as RGB; the fill decodes it at the smallest JPEG scale
        # that still covers the cache side (``decode.decode_covering``).
        return b"rgb-covering-decode"
    return b"identity\0" + loader_identity(loader)


def loader_identity(loader: Any) -> bytes:
    """16 bytes that differ between loaders that can give different pixels (and are
    the same across processes and runs for the same loader); raises
    ``UnidentifiedLoader`` when they cannot be established."""
    parts: list[bytes] = []
    try:
        _Describer(parts).value(loader, 0)
    except UnidentifiedLoader:
        raise
    except Exception as error:  # an object whose attributes misbehave: no identity either
        raise UnidentifiedLoader(f"{type(error).__name__}: {error}") from error
    return hashlib.blake2b(_joined(parts), digest_size=16).digest()


def _joined(parts: list[bytes]) -> bytes:
    """The parts, each after its length: no two lists of parts join alike."""
    return b"".join(len(part).to_bytes(8, "little") + part for part in parts)


class _Describer:
    """Appends a canonical description of values to ``parts``; functions seen
    already (recursion) are referred to by name."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts
        self.seen: set[int] = set()

    def add(self, *texts: Any) -> None:
        self.parts.extend(t if isinstance(t, bytes) else str(t).encode("utf-8", "surrogatepass")
                          for t in texts)

    def value(self, value: Any, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise UnidentifiedLoader("nested too deeply")
        kind = type(value)
        if kind in _SCALARS:
            self.add(kind.__name__, repr(value))
        elif isinstance(value, enum.Enum):
            self.add("enum", _name_of(type(value)), value.name)
        elif isinstance(value, np.generic) and value.dtype.kind in "biufcSU":
            self.add("numpy", value.dtype.str, value.tobytes())
        elif kind is tuple or kind is frozenset:
            self.sequence(kind.__name__, value, depth, sort=kind is frozenset)
        elif kind is functools.partial:
            self.partial(value, depth)
        elif kind is types.FunctionType:
            self.function(value, depth)
        elif kind is types.MethodType:  # a method bound to a class, or to a described value
            self.add("method")
            self.value(value.__func__, depth + 1)
            self.value(value.__self__, depth + 1)
        elif kind is types.ModuleType:
            self.add("module", value.__name__)
        elif isinstance(value, type) or kind is types.BuiltinFunctionType:
            self.add("named", _name_of(value))
        else:
            raise UnidentifiedLoader(f"a {kind.__module__}.{kind.__qualname__} object")

    def sequence(self, tag: str, items: Any, depth: int, sort: bool = False) -> None:
        described = []
        for item in items:
            inner = _Describer([])
            inner.seen = self.seen
            inner.value(item, depth + 1)
            described.append(_joined(inner.parts))
        self.add(tag, len(described), *(sorted(described) if sort else described))

    def partial(self, value: functools.partial, depth: int) -> None:
        self.add("partial")
        self.value(value.func, depth + 1)
        self.sequence("args", value.args, depth)
        self.add("keywords", len(value.keywords))
        for name in sorted(value.keywords):
            self.add(name)
            self.value(value.keywords[name], depth + 1)

    def function(self, function: types.FunctionType, depth: int) -> None:
        self.add("function", function.__module__, function.__qualname__)
        if id(function) in self.seen:
            return  # recursion: named above, described where first met
        self.seen.add(id(function))
        self.code(function.__code__, depth)
        self.sequence("defaults", function.__defaults__ or (), depth)
        keyword_defaults = function.__kwdefaults__ or {}
        self.add("kwdefaults", len(keyword_defaults))
        for name in sorted(keyword_defaults):
            self.add(name)
            self.value(keyword_defaults[name], depth + 1)
        cells = function.__closure__ or ()
        self.add("closure", len(cells))
        for cell in cells:
            try:
                contents = cell.cell_contents
            except ValueError:
                self.add("empty cell")
                continue
            self.value(contents, depth + 1)
        self.globals_read(function, depth)

    def code(self, code: types.CodeType, depth: int) -> None:
        self.add("code", code.co_code, getattr(code, "co_exceptiontable", b""),
                 code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
                 *code.co_names, "|", *code.co_varnames, "|", *code.co_freevars, "|",
                 *code.co_cellvars)
        for constant in code.co_consts:
            if isinstance(constant, types.CodeType):
                self.code(constant, depth + 1)
            else:
                self.value(constant, depth + 1)

    def globals_read(self, function: types.FunctionType, depth: int) -> None:
        names = sorted(_global_names(function.__code__))
        namespace = function.__globals__
        for name in names:
            if name not in namespace:
                continue  # a builtin (named in the code) or not defined yet
            value = namespace[name]
            self.add("global", name)
            name_found = _library_function_name(value, function.__module__)
            if name_found is not None:
                self.add("named", name_found)
            else:
                self.value(value, depth + 1)


def _library_function_name(value: Any, module: str) -> str | None:
    """A function of another module, that its name finds, is known by that name (its
    code is that module's, as a library's is); any other is described in full."""
    if type(value) is not types.FunctionType or value.__module__ == module:
        return None
    try:
        return _name_of(value)
    except UnidentifiedLoader:
        return None


def _global_names(code: types.CodeType) -> set[str]:
    names = {instruction.argval for instruction in dis.get_instructions(code)
             if instruction.opname in _GLOBAL_OPS}
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names


def _name_of(value: Any) -> str:
    """``module:qualname`` of an object that name finds again, or ``UnidentifiedLoader``."""
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if isinstance(value, types.BuiltinFunctionType) and not isinstance(
            value.__self__, (types.ModuleType, type(None), type)):
        raise UnidentifiedLoader(f"the builtin {qualname!r} bound to an object")
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise UnidentifiedLoader(f"{value!r}, which has no importable name")
    found: Any = None
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        found = None
    if found is not value:
        raise UnidentifiedLoader(f"{module}.{qualname}, which its name does not find")
    return f"{module}:{qualname}"
