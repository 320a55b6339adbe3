# Values crossing the jail boundary: tagged JSON that decodes to plain Python values only (no code, no
# custom classes), so whatever the jailed program sends, the verifier compares data, never objects.
import builtins
import json
import math

MAX_DEPTH = 64


class CodecError(ValueError):
    pass


class Handle:
    """The verifier's stand-in for an object that stays in the jail (an instance of a program's class):
    it can be passed back to the program's functions, and equals nothing but itself."""

    def __init__(self, index):
        self.index = index

    def __repr__(self):
        return f"<object #{self.index} in the jail>"


def encode(value, depth=0, handles=None):
    """``value`` as tagged JSON. ``handles`` (the jail's object table): objects that are not plain data go
    there and travel as a reference; without it they are an error."""
    if depth > MAX_DEPTH:
        raise CodecError("value nested too deeply")
    kind = type(value)
    if kind is Handle:
        return ["R", value.index]
    if kind is type and getattr(builtins, value.__name__, None) is value:
        return ["T", value.__name__]
    if value is None:
        return ["n"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", format(value, "x")]
    if kind is float:
        return ["f", value.hex() if math.isfinite(value) else repr(value)]
    if kind is complex:
        return ["c", [encode(value.real, depth + 1, handles), encode(value.imag, depth + 1, handles)]]
    if kind is str:
        return ["s", value]
    if kind is bytes:
        return ["y", value.hex()]
    tags = {list: "l", tuple: "t", set: "S", frozenset: "F"}
    if kind in tags:
        return [tags[kind], [encode(item, depth + 1, handles) for item in value]]
    if kind is dict:
        return ["d", [[encode(k, depth + 1, handles), encode(v, depth + 1, handles)] for k, v in value.items()]]
    for base in (dict, list, tuple, set, frozenset, str, bytes, int, float):  # Counter, namedtuple, ...: as data
        if isinstance(value, base):
            return encode(base(value.items()) if base is dict else base(value), depth, handles)
    if handles is not None:
        handles.append(value)
        return ["R", len(handles) - 1]
    raise CodecError(f"a value of type {kind.__name__} cannot be checked")


def decode(data, depth=0, handles=None):
    """Tagged JSON -> plain data. A reference is ``handles[i]`` in the jail, a :class:`Handle` outside."""
    if depth > MAX_DEPTH or not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise CodecError("malformed value")
    tag, rest = data[0], data[1:]
    if tag == "n" and not rest:
        return None
    if len(rest) != 1:
        raise CodecError("malformed value")
    payload = rest[0]
    if tag == "R" and type(payload) is int:
        if handles is None:
            return Handle(payload)
        if not 0 <= payload < len(handles):
            raise CodecError("unknown object reference")
        return handles[payload]
    if tag == "T" and isinstance(payload, str):
        found = getattr(builtins, payload, None)
        if not isinstance(found, type):
            raise CodecError("unknown type")
        return found
    if tag == "b" and isinstance(payload, bool):
        return payload
    if tag == "i" and isinstance(payload, str):
        return int(payload, 16)
    if tag == "f" and isinstance(payload, str):
        return float(payload) if payload in ("inf", "-inf", "nan") else float.fromhex(payload)
    if tag == "s" and isinstance(payload, str):
        return payload
    if tag == "y" and isinstance(payload, str):
        return bytes.fromhex(payload)
    if tag == "c" and isinstance(payload, list) and len(payload) == 2:
        return complex(decode(payload[0], depth + 1, handles), decode(payload[1], depth + 1, handles))
    containers = {"l": list, "t": tuple, "S": set, "F": frozenset}
    if tag in containers and isinstance(payload, list):
        return containers[tag](decode(item, depth + 1, handles) for item in payload)
    if tag == "d" and isinstance(payload, list):
        pairs = []
        for pair in payload:
            if not isinstance(pair, list) or len(pair) != 2:
                raise CodecError("malformed value")
            pairs.append((decode(pair[0], depth + 1, handles), decode(pair[1], depth + 1, handles)))
        return dict(pairs)
    raise CodecError("malformed value")


def dumps(message):
    return json.dumps(message, separators=(",", ":")) + "\n"
