# Strings on their way to the main process: a batch's list of names travels
# joined into one str (NOTE [ Strings travel joined ] in fastload/_loading/wire/layouts.py).


def join_strings(object items):
    """``"\\0".join(items)``, or None unless that can be split back exactly.

    ``items`` must be a non-empty list or tuple of exact ``str`` (a subclass
    would come back as plain ``str``) none of which holds a NUL character;
    then ``result.split("\\0")`` gives the same strings, in order.
    """
    cdef str text
    if (type(items) is not list and type(items) is not tuple) or not items:
        return None
    for item in items:
        if type(item) is not str:
            return None
        text = <str>item
        if u"\0" in text:
            return None
    return u"\0".join(items)
