# A key for the layout default_collate plans from a batch's first sample.
#
# NOTE [ Layouts planned once ]
# ``collate.plan_collate`` lays a batch out from its first sample: a Python
# call per node, then finds its leaves and their offsets, which costs as
# much as the copies for small samples.  A loader's batches nearly always
# share that layout, so ``collate.PlannedLayouts`` keeps the ones it has
# planned under this key and plans again only for a new key
# (docs/performance.md).
# The key must tell apart any two samples that ``plan_collate`` would lay
# out differently, so it covers only what it can describe exactly: plain
# dicts (str or int keys), lists and tuples, numpy arrays (exactly
# ``np.ndarray``) and scalars of number dtypes, Python floats, bools, ints,
# strs and bytes.  Anything else (a tensor, whose layout also depends on the
# other samples; a mapping subclass, whose clone carries state; a dataclass)
# gives no key, and such a batch is planned every time, as before.
#
# A dtype enters the key as its id(), which is cheaper to hash and compare
# than the dtype and, unlike equality, tells int64 from longlong and a dtype
# from an equal one with metadata.  The dtypes themselves go to ``keep``, for
# the cache to hold: an id names the same object only while that lives.

# Nesting deeper than this gives no key (it is planned every time).
cdef int _MAX_KEY_DEPTH = 16

cdef object _NDARRAY = np.ndarray
cdef tuple _NUMBER_SCALARS = (np.bool_, np.number)


def layout_key(object sample, list keep):
    """A hashable key equal for two samples exactly when ``plan_collate`` lays
    their batches out alike, or None (see NOTE [ Layouts planned once ]).
    The dtypes the key names by id are appended to ``keep``."""
    cdef list parts = []
    if _add_parts(sample, parts, keep, 0):
        return tuple(parts)
    return None


cdef bint _add_parts(object elem, list parts, list keep, int depth) except -1:
    """Append ``elem``'s part of the key; False if it cannot have one."""
    cdef type kind = type(elem)
    cdef object dtype
    if depth > _MAX_KEY_DEPTH:
        return False
    if kind is _NDARRAY:
        dtype = elem.dtype
        if dtype.kind not in "biufc":
            return False
        parts.append(0)
        parts.append(id(dtype))
        parts.append(elem.shape)
        keep.append(dtype)
        return True
    if kind is float:
        parts.append(2)
        return True
    if kind is bool:
        parts.append(3)
        return True
    if kind is int:
        parts.append(4)
        return True
    if kind is str:
        parts.append(5)
        return True
    if kind is bytes:
        parts.append(6)
        return True
    if kind is dict:
        parts.append(7)
        parts.append(len(<dict>elem))
        for key, value in (<dict>elem).items():
            if type(key) is not str and type(key) is not int:
                return False  # equal keys of other types (1.0, True) would not be told apart
            parts.append(key)
            if not _add_parts(value, parts, keep, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        parts.append(8 if kind is list else 9)
        parts.append(len(elem))
        for value in elem:
            if not _add_parts(value, parts, keep, depth + 1):
                return False
        return True
    if isinstance(elem, _NUMBER_SCALARS):
        dtype = elem.dtype
        if dtype.kind not in "biufc":
            return False
        parts.append(1)
        parts.append(id(dtype))
        keep.append(dtype)
        return True
    return False
