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


def _init(self, *args, **kwargs):
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
