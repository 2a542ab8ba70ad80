"""The Jinja sandbox every report template runs in, with every size and count bounded.

Jinja's `ImmutableSandboxedEnvironment` refuses attributes starting with an underscore and
methods that change a list or dict; templates are given plain data only (`plaindata`). What
the sandbox still allows can exhaust memory or time: ``"{:>3300000000}".format("x")``,
``"%3300000000s" % "x"``, ``"x"|center(3300000000)``, ``"x" * 10**9``,
``((10**64)**64)**64``, two nested ``range(100000)`` loops. `ReportEnvironment` closes these:

- every string a template builds (``*``, ``+``, ``~``, ``%``, ``str.format``, the filters and
  string methods that pad, indent, wrap, replace or join) is at most `MAX_STRING` characters,
  checked *before* it is built; a list at most `MAX_ITEMS` items; an integer at most
  `MAX_INT_BITS` bits (``**`` and ``*`` on integers are checked from the operands' sizes);
- any value written out or turned into a string (``{{ x }}``, ``|string``, ``~``) is sized
  first, so a list holding one long string a million times is refused, not printed;
- loop iterations, calls (macros, methods) and the work of filters and operators (1 per item
  or 1,000 characters of their input) together are counted per render, at most `MAX_STEPS`:
  nested loops, ``range(100000)|sum`` in a loop and macros that call each other exponentially
  often stop with a clear error within seconds;
- the whole output, and every captured block or macro body, is at most `MAX_OUTPUT`;
- string methods are a whitelist (no `translate`, `encode`, ...), and so are the methods of
  lists, dicts and numbers; `lipsum` and `pprint` are gone.

A refusal raises `TemplateLimit`, which `jinja_env.user_template_errors` reports in one line
naming the template and line.
"""

from __future__ import annotations

import re
import string
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import jinja2
import jinja2.filters
from jinja2 import nodes
from jinja2.environment import TemplateModule
from jinja2.runtime import Macro, Namespace, Undefined
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from attntrace.rendering.plaindata import plain_context

#: The longest string a template may build, in characters.
MAX_STRING = 10_000_000
#: The most items a list or tuple built by a template may hold.
MAX_ITEMS = 1_000_000
#: The largest integer a template may build, in bits (about 30,000 decimal digits).
MAX_INT_BITS = 100_000
#: A report (one template's whole output, or one captured block) may not be longer than this.
MAX_OUTPUT = 50_000_000
#: Loop iterations plus calls (each `CALL_COST`) in one render. The largest shipped report
#: (every example, every row expanded) uses about 1% of it; 1,000,000 loop iterations take
#: about a second, and so do 100,000 macro calls.
MAX_STEPS = 1_000_000
CALL_COST = 10
#: The longest `range` a template may make (Jinja's own sandbox limit).
MAX_RANGE = 100_000


class TemplateLimit(SecurityError):
    """A template wrote too much, built too large a value or ran too long."""


# ----------------------------------------------------------------------------- the step budget

_STATE = threading.local()


def _spend(cost: int = 1) -> None:
    left = getattr(_STATE, "left", MAX_STEPS) - cost
    _STATE.left = left
    if left < 0:
        raise TemplateLimit(f"more than {MAX_STEPS:,} loop iterations in one render (a call counts {CALL_COST}, "
                            "a filter or operator 1 per item or 1,000 characters of its input)")


@contextmanager
def fresh_budget() -> Iterator[None]:
    """A new budget of `MAX_STEPS` for one render (or one call of a macro from Python)."""
    previous = getattr(_STATE, "left", MAX_STEPS)
    _STATE.left = MAX_STEPS
    try:
        yield
    finally:
        _STATE.left = previous


#: Filters that take constant time whatever their input's size: charged one step.
CHEAP_FILTERS = frozenset({"length", "count", "first", "last", "default", "d", "attr", "int", "float", "abs", "round", "bool"})


def _cost(value: Any) -> int:
    """Steps charged for work on `value`: a string 1 per 1,000 characters, a collection 1 per item."""
    if isinstance(value, str):
        return 1 + len(value) // 1000
    try:
        return 1 + len(value)
    except TypeError:
        return 1


def _charged(name: str, fn):
    """A filter whose work is charged to the render's budget: by its input's size, or item by
    item as it consumes an iterator (``range(100000)|sum`` in a loop of 100,000 stops)."""
    passes = getattr(fn, "jinja_pass_arg", None)

    def charged(*args, **kwargs):
        i = 1 if passes is not None else 0
        if len(args) > i:
            value = args[i]
            if isinstance(value, Iterator):
                args = (*args[:i], _counted(value), *args[i + 1:])
            else:
                _spend(_cost(value))
        return fn(*args, **kwargs)
    charged.__name__ = name
    if passes is not None:
        charged.jinja_pass_arg = passes
    return charged


def _counted(iterable: Any) -> Iterator[Any]:
    """Every `for` loop iterates through this filter (added to each template's syntax tree)."""
    for item in iterable:
        _spend()
        yield item


# ----------------------------------------------------------------------------- sizes

def _size(value: Any, limit: int) -> int:
    """An upper estimate of len(str(value)), exact for a string; stops counting past `limit`."""
    total, stack = 0, [value]
    while stack:
        if total > limit:
            return total
        v = stack.pop()
        kind = type(v)
        if isinstance(v, str):
            total += len(v) if v is value else 4 * len(v) + 2  # repr may escape characters
        elif kind in (int, bool):
            total += v.bit_length() * 3 // 10 + 3
        elif kind is float or v is None:
            total += 26
        elif kind in (list, tuple, set, frozenset):
            total += 2 + 2 * len(v)
            stack.extend(v)
        elif kind is dict:
            total += 2 + 4 * len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, Namespace):
            attrs = object.__getattribute__(v, "_Namespace__attrs")
            total += 14 + 4 * len(attrs)
            stack.extend(attrs.values())
        elif isinstance(v, TemplateModule):
            total += sum(len(p) for p in object.__getattribute__(v, "_body_stream"))
        else:
            total += 200  # a macro, a loop, an undefined: a short repr (or an error)
    return total


def check_size(value: Any, what: str = "a string") -> Any:
    """`value` if it is not longer than the limits; TemplateLimit otherwise."""
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise TemplateLimit(f"{what} of {len(value):,} characters is too long for a template (at most {MAX_STRING:,})")
    elif isinstance(value, (list, tuple)) and len(value) > MAX_ITEMS:
        raise TemplateLimit(f"a list of {len(value):,} items is too long for a template (at most {MAX_ITEMS:,})")
    return value


def bounded_str(value: Any) -> str:
    """str(value), refused before it is built when it would exceed `MAX_STRING`."""
    if isinstance(value, (str, Undefined)):
        return str(value)
    if _size(value, MAX_STRING) > MAX_STRING:
        raise TemplateLimit(f"writing out this {type(value).__name__} would take more than {MAX_STRING:,} characters")
    return str(value)


def _need(n: int, what: str) -> None:
    if n > MAX_STRING:
        raise TemplateLimit(f"{what} would build {n:,} characters, too many for a template (at most {MAX_STRING:,})")


def _width(n: Any, what: str) -> int:
    if isinstance(n, int) and n > MAX_STRING:
        raise TemplateLimit(f"{what} {n:,} is too large for a template (at most {MAX_STRING:,})")
    return n


def bounded_join(items: Any, sep: str = "") -> str:
    """sep.join(str(item) ...) with the total checked before joining (and charged)."""
    parts, total = [], 0
    for item in items:
        _spend()
        part = bounded_str(item)
        total += len(part) + (len(sep) if parts else 0)
        _need(total, "joining")
        parts.append(part)
    return sep.join(parts)


_PERCENT_SPEC = r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?([a-zA-Z%])"  # compiled by `re` on first use


def _check_percent(fmt: str, args: Any) -> None:
    """``fmt % args``: widths and precisions (none may be `*`) and the arguments' sizes."""
    need = len(fmt)
    for m in re.finditer(_PERCENT_SPEC, fmt):
        for number in m.group(1, 2):
            if number == "*":
                raise TemplateLimit("a * width in %-formatting is not allowed in a template")
            if number:
                need += int(number) if len(number) < 12 else MAX_STRING + 1
    values = args.values() if isinstance(args, dict) else args if isinstance(args, tuple) else (args,)
    need += sum(_size(v, MAX_STRING) for v in values)
    _need(need, "%-formatting")


def _check_format(fmt: str, args: tuple, kwargs: dict) -> None:
    """``fmt.format(*args, **kwargs)``: no nested fields in a spec, widths and precisions and
    the arguments' sizes within `MAX_STRING`."""
    need = len(fmt)
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format raises the same error
    for _, field, spec, _ in fields:
        if spec and "{" in spec:
            raise TemplateLimit("a nested {} in a format spec is not allowed in a template")
        for number in re.findall(r"\d+", spec or ""):
            need += int(number) if len(number) < 12 else MAX_STRING + 1
    need += sum(_size(v, MAX_STRING) for v in (*args, *kwargs.values()))
    _need(need, "str.format")


# ----------------------------------------------------------------------------- bounded filters

def _stringifying(name: str, fn):
    """A filter that turns its input into a string: the input is sized first."""
    def bounded(*args, **kwargs):
        args = list(args)
        i = 1 if args and isinstance(args[0], (jinja2.Environment, jinja2.nodes.EvalContext, jinja2.runtime.Context)) else 0
        if len(args) > i and not isinstance(args[i], str):
            bounded_str(args[i])
        return check_size(fn(*args, **kwargs))
    bounded.__name__ = name
    for attr in ("jinja_pass_arg",):
        if hasattr(fn, attr):
            setattr(bounded, attr, getattr(fn, attr))
    return bounded


def _center(value: Any, width: int = 80) -> str:
    return jinja2.filters.do_center(bounded_str(value), _width(width, "|center width"))


def _indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    s = bounded_str(s)
    pad = len(width) if isinstance(width, str) else _width(width, "|indent width")
    _need(len(s) + pad * (s.count("\n") + 1), "|indent")
    return jinja2.filters.do_indent(s, width, first, blank)


@jinja2.pass_environment
def _wordwrap(environment, s: Any, width: int = 79, break_long_words: bool = True, wrapstring: str | None = None,
              break_on_hyphens: bool = True) -> str:
    s = bounded_str(s)
    sep = environment.newline_sequence if wrapstring is None else bounded_str(wrapstring)
    if isinstance(width, int) and width >= 1:
        _need(len(s) + (len(s) // width + s.count("\n") + 1) * len(sep), "|wordwrap")
    return jinja2.filters.do_wordwrap(environment, s, width, break_long_words, wrapstring, break_on_hyphens)


@jinja2.pass_eval_context
def _replace(eval_ctx, s: Any, old: Any, new: Any, count: int | None = None) -> str:
    s, old, new = bounded_str(s), bounded_str(old), bounded_str(new)
    _check_replace(s, old, new, count)
    return jinja2.filters.do_replace(eval_ctx, s, old, new, count)


def _check_replace(s: str, old: str, new: str, count: Any = None) -> None:
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    _need(len(s) + hits * max(0, len(new) - len(old)), "replace")


@jinja2.pass_eval_context
def _join(eval_ctx, value: Any, d: str = "", attribute: str | int | None = None) -> str:
    if attribute is not None:
        getter = jinja2.filters.make_attrgetter(eval_ctx.environment, attribute)
        value = map(getter, value)
    return bounded_join(value, bounded_str(d))


def _format(value: Any, *args: Any, **kwargs: Any) -> str:
    if args and kwargs:
        raise jinja2.FilterArgumentError("can't handle positional and keyword arguments at the same time")
    fmt = bounded_str(value)
    values = kwargs or args
    _check_percent(fmt, values)
    return fmt % values


def _batch(value: Any, linecount: int, fill_with: Any = None):
    _width(linecount, "|batch size")
    return jinja2.filters.do_batch(value, linecount, fill_with)


def _slice(value: Any, slices: int, fill_with: Any = None):
    if isinstance(slices, int) and slices > MAX_ITEMS:
        raise TemplateLimit(f"|slice into {slices:,} parts is too many for a template")
    return jinja2.filters.do_slice(value, slices, fill_with)


_STRINGIFYING = ("string", "truncate", "urlize", "upper", "lower", "title", "capitalize", "trim", "striptags",
                 "escape", "e", "forceescape", "safe", "urlencode", "tojson", "wordcount", "xmlattr", "list", "reverse")
#: Filters replaced by bounded versions, and those removed.
BOUNDED_FILTERS = {"center": _center, "indent": _indent, "wordwrap": _wordwrap, "replace": _replace, "join": _join,
                   "format": _format, "batch": _batch, "slice": _slice}
REMOVED_FILTERS = ("pprint",)


def bounded_range(*args: int) -> range:
    rng = range(*args)
    if len(rng) > MAX_RANGE:
        raise TemplateLimit(f"a range of {len(rng):,} numbers is too long for a template (at most {MAX_RANGE:,})")
    return rng


# ----------------------------------------------------------------------------- attributes

#: The only methods of plain values a template may call (the rest of each type is refused).
SAFE_METHODS: dict[type, frozenset[str]] = {
    str: frozenset("""startswith endswith strip lstrip rstrip split rsplit splitlines lower upper title capitalize
        casefold swapcase count find rfind index rindex partition rpartition removeprefix removesuffix isdigit isalpha
        isalnum isspace islower isupper isnumeric isdecimal istitle isidentifier isprintable isascii format format_map
        center ljust rjust zfill expandtabs replace join""".split()),
    list: frozenset({"index", "count"}), tuple: frozenset({"index", "count"}),
    dict: frozenset({"get", "items", "keys", "values"}),
    int: frozenset(), float: frozenset({"is_integer"}), bool: frozenset(),
}


#: The names `x.name` finds as attributes of a dict (its methods), not as its items.
_DICT_ATTRIBUTES = frozenset(dir(dict))


def _check_str_call(obj: str, name: str, args: tuple, kwargs: dict) -> None:
    """Pre-check the string methods that can build long strings."""
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _width(args[0], f"str.{name} width")
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int):
            _need(len(obj) + obj.count("\t") * tab, "str.expandtabs")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        _check_replace(obj, args[0], args[1], args[2] if len(args) > 2 else None)


# ----------------------------------------------------------------------------- the environment

class _ChargedFilters(dict):
    """The filter table: every filter set in it (also those attntrace registers later, such as
    `tex_escape`) is wrapped so that its work is charged to the step budget."""

    def __init__(self, filters: dict) -> None:
        super().__init__()
        for name, fn in filters.items():
            self[name] = fn

    def __setitem__(self, name: str, fn) -> None:
        if name != "attntrace_loop" and name not in CHEAP_FILTERS and not getattr(fn, "attntrace_charged", False):
            fn = _charged(name, fn)
            fn.attntrace_charged = True
        super().__setitem__(name, fn)


class BudgetedTemplate(jinja2.Template):
    """A template whose every render gets plain data only (`plain_context`) and a fresh
    step budget."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        plain_context(dict(*args, **kwargs))
        with fresh_budget():
            return super().render(*args, **kwargs)

    def make_module(self, vars=None, shared=False, locals=None):
        if vars and not shared:  # from Python (`shared`: an import with context, inside a checked render)
            plain_context(vars)
        with fresh_budget():
            return super().make_module(vars, shared, locals)


class ReportEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with every size and count a template controls bounded."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    template_class = BudgetedTemplate

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, finalize=bounded_str, **kwargs)
        self.globals = {"range": bounded_range, "dict": dict, "cycler": jinja2.utils.Cycler,
                        "joiner": jinja2.utils.Joiner, "namespace": Namespace}
        filters = {}
        for name, fn in jinja2.filters.FILTERS.items():
            if name in REMOVED_FILTERS:
                continue
            filters[name] = BOUNDED_FILTERS.get(name) or (_stringifying(name, fn) if name in _STRINGIFYING else fn)
        self.filters = filters
        self.filters["attntrace_loop"] = _counted

    @property
    def filters(self) -> dict:
        return self._filters

    @filters.setter
    def filters(self, value: dict) -> None:
        self._filters = _ChargedFilters(value)

    # -- syntax: every loop counted, every `~` bounded
    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Filter(loop.iter, "attntrace_loop", [], [], None, None, lineno=loop.lineno)
        return tree

    def _generate(self, source, name, filename, defer_init=False) -> str:
        code = super()._generate(source, name, filename, defer_init)
        # `~` compiles to the module's `str_join` (imported from jinja2.runtime); bind ours
        return code + "\nstr_join = environment.bounded_str_join\n"

    def _compile(self, source: str, filename: str):
        """Jinja can generate Python that does not compile (``{{ [1, 2][:1, :1] }}``): that is a
        syntax error of the template, on the template line the Python line came from."""
        try:
            return super()._compile(source, filename)
        except (SyntaxError, ValueError, OverflowError, RecursionError) as exc:
            line = 1
            found = re.search(r"^debug_info = '([\d=&]*)'", source, re.M)
            if found and isinstance(exc, SyntaxError) and exc.lineno:
                pairs = [tuple(map(int, p.split("="))) for p in found.group(1).split("&") if "=" in p]
                line = max((tpl for tpl, py in pairs if py <= exc.lineno), default=1)
            what = exc.msg if isinstance(exc, SyntaxError) else type(exc).__name__
            raise jinja2.TemplateSyntaxError(f"this expression cannot be compiled ({what})", line,
                                             filename=filename) from None

    @staticmethod
    def bounded_str_join(seq: Any) -> str:
        return bounded_join(seq)

    def concat(self, pieces) -> str:  # a whole render, a captured block and a macro body are joined here
        out, size = [], 0
        frame = getattr(pieces, "gi_frame", None)  # a whole render: its template names the error
        try:
            for piece in pieces:
                size += len(piece)
                if size > MAX_OUTPUT:
                    raise TemplateLimit(f"writes more than {MAX_OUTPUT:,} characters")
                out.append(piece)
            return "".join(out)
        except TemplateLimit as exc:  # also the time limit, when it strikes here
            if getattr(exc, "template_file", None) is None and frame is not None:
                exc.template_file = frame.f_code.co_filename
            raise

    # -- operators
    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if isinstance(left, (str, list, tuple)) or isinstance(right, (str, list, tuple)):
            _spend(_cost(left) + _cost(right))
        if operator == "**":
            if type(left) in (int, bool) and type(right) in (int, bool) and abs(left) > 1 and right > 0:
                if right > MAX_INT_BITS or left.bit_length() * right > MAX_INT_BITS:
                    raise TemplateLimit(f"a power with about {left.bit_length() * right:,} bits is too large for a template")
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and type(n) in (int, bool) and n > 0:
                    if isinstance(seq, str):
                        _need(len(seq) * n, "a repetition")
                    elif len(seq) * n > MAX_ITEMS:
                        raise TemplateLimit(f"a repetition of {len(seq) * n:,} items is too large for a template")
            if type(left) is int and type(right) is int and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateLimit("a product of this size is too large for a template")
        elif operator == "+":
            if isinstance(left, str) and isinstance(right, str):
                _need(len(left) + len(right), "a concatenation")
            elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)) and len(left) + len(right) > MAX_ITEMS:
                raise TemplateLimit(f"a list of {len(left) + len(right):,} items is too long for a template")
        elif operator == "%" and isinstance(left, str):
            _check_percent(left, right)
        return super().call_binop(context, operator, left, right)

    # -- calls and attributes
    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's signature
        _spend(CALL_COST)
        if type(__obj) is Macro:  # a template's macro (most calls): it runs in this sandbox, and
            return __context.call(__obj, *args, **kwargs)  # Jinja's checks below all pass it
        owner = getattr(__obj, "__self__", None)
        if not isinstance(owner, str):
            return super().call(__context, __obj, *args, **kwargs)
        name = getattr(__obj, "__name__", "")
        _spend(_cost(owner))
        if name == "join" and len(args) == 1 and not kwargs:
            return bounded_join(args[0], owner)
        _check_str_call(owner, name, args, kwargs)
        return check_size(super().call(__context, __obj, *args, **kwargs), f"str.{name}")

    def getattr(self, obj: Any, attribute: str) -> Any:
        """`x.name` on a dict, the plain data most of a template's reads go to: its item, as
        Jinja's lookup gives it whenever dict has no attribute of that name, without the
        AttributeError Jinja's lookup raises and catches first (~760 reads in a small report,
        1 us each)."""
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if attr.startswith("_"):
            return False
        kind = type(obj)
        if kind is TemplateModule:  # another template's macros and variables
            return True
        allowed = SAFE_METHODS.get(kind)
        if allowed is None:
            allowed = next((a for k, a in SAFE_METHODS.items() if isinstance(obj, k)), None)
        if allowed is not None:  # plain data: a whitelist, stricter than Jinja's checks
            return attr in allowed or not callable(value)
        return super().is_safe_attribute(obj, attr, value)

    def wrap_str_format(self, value: Any):
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt, is_map = value.__self__, value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> str:
            if is_map:
                _check_format(fmt, (), args[0] if len(args) == 1 and isinstance(args[0], dict) else {})
            else:
                _check_format(fmt, args, kwargs)
            return check_size(wrapper(*args, **kwargs))
        return bounded
