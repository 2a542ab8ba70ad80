"""What a template may be given: plain data, checked before every render.

A template folder can come from anyone (a colleague's shared folder), so a template must not
be able to reach anything that acts: a NumPy array has `tofile`, a Trace holds arrays, a SymPy
object has methods that evaluate. Templates therefore get only *plain data* built for the view:
strings, numbers, booleans, None, and lists, tuples and dicts (string keys) of them, plus the
macros of other templates (`f`, `p`, `m`: Jinja TemplateModule and Macro, which run in the
same sandbox). `plain_context` walks a context and raises on anything else, so that a view
that starts passing a live object fails loudly in the tests instead of leaking into templates.
`to_plain` converts the few non-plain values views legitimately hold (NumPy scalars, tuples
of them) where a view is built.
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping

import jinja2.environment
import jinja2.runtime

#: The scalar types a template may see (exact types: no subclass with extra methods).
PLAIN_SCALARS = (str, int, float, bool, type(None))
#: Containers whose items are checked in turn.
PLAIN_CONTAINERS = (list, tuple, dict)
#: Template-made callables: they run in the same sandbox as the template that calls them.
TEMPLATE_OBJECTS = (jinja2.environment.TemplateModule, jinja2.runtime.Macro)

#: A context deeper than this is refused (views are a few levels deep).
MAX_DEPTH = 40


class Formatted(str):
    """User text already formatted for its output (math printed, the rest escaped): the
    escaping filters pass it through unchanged. A str subclass without methods of its own."""


_EXACT = frozenset({*PLAIN_SCALARS, Formatted})


class NotPlain(TypeError):
    """A template context holds something other than plain data (a bug in a view)."""


def plain_context(context: Mapping[str, Any], where: str = "template context") -> Mapping[str, Any]:
    """Return `context` unchanged if every value in it is plain data; raise NotPlain naming
    the first path to a value that is not (``r.steps[2].value: numpy.ndarray``)."""
    for key, value in context.items():
        _check(value, str(key), 0, set())
    return context


def _check(value: Any, path: str, depth: int, seen: set[int]) -> None:
    kind = type(value)
    if kind in _EXACT:
        return
    if isinstance(value, TEMPLATE_OBJECTS):
        return
    if kind not in PLAIN_CONTAINERS:
        raise NotPlain(f"{path}: {kind.__module__}.{kind.__qualname__} is not plain data; a template gets "
                       "strings, numbers, booleans, None, lists, tuples and dicts only")
    if depth > MAX_DEPTH:
        raise NotPlain(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if id(value) in seen:  # a cycle (a shared sub-list is fine: only the current path counts)
        raise NotPlain(f"{path}: refers to itself")
    seen.add(id(value))
    try:
        if kind is dict:
            for k, v in value.items():
                if type(k) not in (str, int):
                    raise NotPlain(f"{path}: key {k!r} of type {type(k).__name__} is not a string")
                _check(v, f"{path}[{k!r}]", depth + 1, seen)
        else:
            for i, v in enumerate(value):
                _check(v, f"{path}[{i}]", depth + 1, seen)
    finally:
        seen.discard(id(value))


def to_plain(value: Any) -> Any:
    """`value` as plain data: NumPy and other numbers to int/float, tuples and lists item by
    item, dicts with string keys. Anything else is refused (NotPlain): convert it in the view."""
    kind = type(value)
    if kind in _EXACT:
        return value
    if isinstance(value, bool) or kind.__name__ == "bool_":
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (list, tuple)):
        return type(value)(to_plain(v) for v in value) if kind in (list, tuple) else [to_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, str):
        return str(value)
    raise NotPlain(f"{kind.__module__}.{kind.__qualname__} is not plain data")
