"""`@record`: a frozen dataclass whose methods are written once, here, for every record.

`@dataclass(frozen=True)` compiles six methods per class (__init__, __repr__, __eq__, __hash__,
__setattr__, __delattr__), each with its own `exec`: 0.6-0.9 ms a class, paid by every process
that imports the class (start-up, issue 26). A record is still a dataclass (`dataclasses.fields`,
`replace`, `asdict` and `is_dataclass` work; assigning a field raises FrozenInstanceError), and
it behaves as the frozen dataclass would: positional or keyword construction with defaults and
default factories, then `__post_init__`; equality of the same class by the tuple of the compared
fields; the hash of that tuple; the same repr. Only the methods' code is shared, read from
`__dataclass_fields__` instead of generated.
"""

from __future__ import annotations

import dataclasses
import reprlib
from dataclasses import MISSING, FrozenInstanceError


def record(cls: type) -> type:
    """Make `cls` a frozen dataclass with the shared methods (see the module docstring)."""
    cls = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
    fields = [f for f in dataclasses.fields(cls)]
    init = [f for f in fields if f.init]
    required = next((i for i, f in enumerate(init) if f.default is not MISSING or f.default_factory is not MISSING), len(init))
    cls._record_init = (tuple(f.name for f in init), required,
                        tuple((f.default, f.default_factory) for f in init[required:]),
                        tuple(f.name for f in fields if not f.init), hasattr(cls, "__post_init__"))
    cls._record_compare = tuple(f.name for f in fields if f.compare)
    cls._record_repr = tuple(f.name for f in fields if f.repr)
    cls.__init__ = _init
    cls.__repr__ = _repr
    cls.__eq__ = _eq
    cls.__hash__ = _hash
    cls.__setattr__ = _setattr
    cls.__delattr__ = _delattr
    return cls


#: A record type built this many times gets a constructor of its own (`_compile_init`); before
#: that the shared one serves, so a type built a few times per process costs no compile.
COMPILE_AFTER = 64
_built: dict[type, int] = {}


def _init(self, *args, **kwargs):
    cls = type(self)
    count = _built[cls] = _built.get(cls, 0) + 1
    if count == COMPILE_AFTER and "_record_compiled" not in cls.__dict__:
        _compile_init(cls)
    names, required, defaults, _, post_init = self._record_init
    if len(args) > len(names):
        raise TypeError(f"{type(self).__name__}() takes {len(names)} arguments but {len(args)} were given")
    if kwargs and args:
        twice = next((n for n in names[:len(args)] if n in kwargs), None)
        if twice is not None:
            raise TypeError(f"{type(self).__name__}() got multiple values for argument {twice!r}")
    d = self.__dict__
    for name, value in zip(names, args):
        d[name] = value
    for i in range(len(args), len(names)):
        name = names[i]
        if name in kwargs:
            d[name] = kwargs.pop(name)
        elif i >= required:
            default, factory = defaults[i - required]
            d[name] = factory() if factory is not MISSING else default
        else:
            raise TypeError(f"{type(self).__name__}() missing required argument: {name!r}")
    if kwargs:
        extra = next(iter(kwargs))
        raise TypeError(f"{type(self).__name__}() got {'multiple values for' if extra in names else 'an unexpected keyword'} "
                        f"argument {extra!r}")
    _no_init_fields(self)
    if post_init:
        self.__post_init__()


def _compile_init(cls: type) -> None:
    """Give a record type built often (a trace's steps) an __init__ of its own: the dataclass's
    signature, each field stored directly (a quarter of the shared constructor's time)."""
    names, required, defaults, no_init, post_init = cls._record_init
    params = ["self", *names[:required]]
    namespace: dict = {"_MISSING": MISSING, "_no_init_fields": _no_init_fields}
    lines = ["    _store = self.__dict__"]
    for i, name in enumerate(names[required:]):
        default, factory = defaults[i]
        if factory is MISSING:
            namespace[f"_default_{name}"] = default
            params.append(f"{name}=_default_{name}")
            lines.append(f"    _store[{name!r}] = {name}")
        else:
            namespace[f"_factory_{name}"] = factory
            params.append(f"{name}=_MISSING")
            lines.append(f"    _store[{name!r}] = _factory_{name}() if {name} is _MISSING else {name}")
    lines[1:1] = [f"    _store[{n!r}] = {n}" for n in names[:required]]
    if no_init:
        lines.append("    _no_init_fields(self)")
    if post_init:
        lines.append("    self.__post_init__()")
    exec(compile(f"def __init__({', '.join(params)}):\n" + "\n".join(lines) + "\n", f"<record {cls.__name__}>", "exec"), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init
    cls._record_compiled = True


def _no_init_fields(self) -> None:
    """Fields with init=False take their default (or factory) as a dataclass's __init__ sets them."""
    for name in self._record_init[3]:
        f = self.__dataclass_fields__[name]
        if f.default_factory is not MISSING:
            self.__dict__[name] = f.default_factory()
        elif f.default is not MISSING:
            self.__dict__[name] = f.default


@reprlib.recursive_repr()
def _repr(self) -> str:
    return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self._record_repr)})"


def _key(self) -> tuple:
    d = self.__dict__
    return tuple(d[n] for n in self._record_compare)


def _eq(self, other):
    if other.__class__ is self.__class__:
        return _key(self) == _key(other)
    return NotImplemented


def _hash(self) -> int:
    return hash(_key(self))


def _setattr(self, name, value):
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self, name):
    raise FrozenInstanceError(f"cannot delete field {name!r}")
