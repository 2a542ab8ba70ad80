"""The Jinja2 environments of reports, cached within a process and compiled across processes.

Within a process, one environment per (template folder, cache folder) is built and kept:
Jinja keeps each compiled template, and with auto_reload (the default) checks the file's
real path and mtime, once per render (`one_render`), so an edited user template is
recompiled on the next render, and a template newly added to the user's folder overrides the
shipped one from the next render on (`_OverlayLoader`, whose up-to-date check also looks for it).

Across processes, compiled templates go to a Jinja FileSystemBytecodeCache in the user's cache
folder (`cache_dir()`), rather than being precompiled at build time (Environment.compile_templates
+ ModuleLoader): the bytecode cache covers the user's own --template-dir as well as the shipped
templates; it works the same in a source checkout, an editable and a wheel install; it needs no
build step to keep in sync while the templates change; and it cannot go stale (Jinja checks
every entry against a checksum of the template's source, and Jinja's version and the
environment options are part of the file names). The first render after an install or a
template edit compiles and stores; later processes only read (a cold `attntrace run` skips
~50 ms of Jinja compiling). When the folder cannot be created or written, or other users could
write to it, rendering compiles from source and says nothing; nothing is ever written into the
installed package.

Every environment is `sandbox.ReportEnvironment`, Jinja's immutable sandbox with
every size and count bounded, and every template file is read by `templatefiles.FolderLoader`
(inside its folder, regular files, at most 1 MiB): a template folder shared by a colleague can
lay out a report but cannot run code, read or write a file, or exhaust memory or time. Templates
are given plain data only (`plaindata.plain_context` guards every render). The shipped
templates run in the same sandbox: a user folder overrides single templates, so both kinds
meet in one environment. Sandboxed templates compile to different code, so the sandbox is
part of the bytecode cache's fingerprint: a template compiled without it is never loaded.

An error in a template of the user's folder (syntax, undefined variable, missing include,
macros recursing without end, an unsafe attribute) becomes one line naming the template and
the line, ``template md/report.j2, line 3: 'x' is undefined`` (`user_template_errors`).
"""

from __future__ import annotations

import hashlib
import io
import marshal
import os
import pickle
import threading
from collections import OrderedDict
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterator

import jinja2
from jinja2.bccache import bc_magic
from jinja2.sandbox import SecurityError

from attntrace.model.errors import AttntraceError, BadInput
from attntrace.rendering.templatefiles import FolderLoader
from attntrace.rendering.sandbox import ReportEnvironment, TemplateLimit

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the attntrace package

#: The options every report environment is built with. With Jinja's version they name the
#: bytecode cache's files: changing one recompiles every template.
ENV_OPTIONS: dict[str, Any] = {"autoescape": False, "trim_blocks": True, "lstrip_blocks": True, "keep_trailing_newline": True}

#: Environments by (template folders, options, bytecode cache folder), most recently used last.
_ENVIRONMENTS: "OrderedDict[tuple, jinja2.Environment]" = OrderedDict()
_MAX_ENVIRONMENTS = 16
_LOCK = threading.Lock()


class _Render:
    """What one render has learnt about the template files: the up-to-date checks that passed
    and the names found nowhere. Jinja runs a template's up-to-date check (a realpath and an
    mtime, ~20 us) on every get_template, include and import, and looks up every missing name
    of an include list again: ~45 checks and 15 misses in a small report, for ~11 templates.
    Within one render each is done once; the next render checks every file again, so an
    edited, added or removed template is noticed by the next render."""

    __slots__ = ("fresh", "missing")

    def __init__(self) -> None:
        self.fresh: set = set()
        self.missing: set[tuple] = set()  # (loader, name)


_RENDER: ContextVar[_Render | None] = ContextVar("attntrace_template_render", default=None)


@contextmanager
def one_render() -> Iterator[None]:
    """Around one render (`user_template_errors` opens it): each template file is checked once.
    Nested, the outer render's scope holds."""
    token = _RENDER.set(_Render()) if _RENDER.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _RENDER.reset(token)


def _checked_once(uptodate):
    """`uptodate`, run at most once per render while it holds (every time outside a render)."""

    def check() -> bool:
        render = _RENDER.get()
        if render is None:
            return uptodate()
        if check in render.fresh:
            return True
        ok = uptodate()
        if ok:
            render.fresh.add(check)
        return ok

    return check


class _OverlayLoader(jinja2.ChoiceLoader):
    """ChoiceLoader whose up-to-date check also notices a template that appears in an earlier
    folder: a shipped template stays cached only while no user folder has a file of that name,
    so adding `steps/Q.j2` to the user's folder in a long session overrides it from the next
    render on. Within one render (`one_render`) each check runs once and a missing name is
    looked up once."""

    def get_source(self, environment, template):
        render = _RENDER.get()
        if render is not None and (self, template) in render.missing:
            raise jinja2.TemplateNotFound(template)
        try:
            source, filename, uptodate = self._find(environment, template)
        except jinja2.TemplateNotFound:
            if render is not None:
                render.missing.add((self, template))
            raise
        if uptodate is None:
            return source, filename, uptodate
        check = _checked_once(uptodate)
        if render is not None:  # just read: up to date for the rest of this render
            render.fresh.add(check)
        return source, filename, check

    def _find(self, environment, template):
        pieces = jinja2.loaders.split_template_path(template)
        for i, loader in enumerate(self.loaders):
            try:
                source, filename, uptodate = loader.get_source(environment, template)
            except jinja2.TemplateNotFound:
                continue
            except UnicodeDecodeError:
                raise jinja2.TemplateSyntaxError("the file is not UTF-8 text", 1, template) from None
            except OSError as exc:
                raise jinja2.TemplateSyntaxError(f"cannot read the file: {exc.strerror or exc}", 1, template) from None
            earlier = [os.path.join(root, *pieces) for ld in self.loaders[:i] if isinstance(ld, jinja2.FileSystemLoader)
                       for root in ld.searchpath]
            if not earlier or uptodate is None:
                return source, filename, uptodate
            return source, filename, lambda: uptodate() and not any(os.path.isfile(p) for p in earlier)
        raise jinja2.TemplateNotFound(template)

    #: ChoiceLoader.load asks each loader in turn, which would skip get_source above; the base
    #: class's load goes through it (and through the bytecode cache).
    load = jinja2.BaseLoader.load


class _QuietBytecodeCache(jinja2.FileSystemBytecodeCache):
    """A FileSystemBytecodeCache that never fails a render: a cache file that cannot be read or
    written (full disk, read-only folder, truncated file, another process clearing it) only
    means the template is compiled from source this time. Entries are keyed on the template's
    name and file, so a folder that comes and goes (a temporary --template-dir) leaves files
    behind: after a write (a cache miss, rare) the oldest files of the folder (this Jinja's and
    any older version's) are removed beyond `MAX_FILES`."""

    MAX_FILES = 512

    def load_bytecode(self, bucket) -> None:
        """The file read whole, then unmarshalled from memory: Jinja's own load hands the open
        file to marshal.load, which reads it with one Python-level readinto per string of the
        code (a small report's eleven templates: 2.7 ms that way, 0.5 ms from memory)."""
        try:
            with open(self._get_cache_filename(bucket), "rb") as f:
                data = f.read()
            if not data.startswith(bc_magic):
                return
            head = io.BytesIO(data)
            head.seek(len(bc_magic))
            if pickle.load(head) != bucket.checksum:  # the template changed since
                return
            bucket.code = marshal.loads(memoryview(data)[head.tell():])
        except Exception:  # noqa: BLE001 - a missing or broken cache file is a cache miss
            bucket.reset()

    def dump_bytecode(self, bucket) -> None:
        try:
            super().dump_bytecode(bucket)
            self._prune()
        except Exception:  # noqa: BLE001 - an unwritable cache is no cache
            pass

    def _prune(self) -> None:
        entries = [e for e in os.scandir(self.directory) if e.name.endswith((".cache", ".tmp")) and e.is_file()]
        if len(entries) <= self.MAX_FILES:
            return
        entries.sort(key=lambda e: e.stat().st_mtime)
        for e in entries[: len(entries) - self.MAX_FILES * 3 // 4]:
            try:
                os.remove(e.path)
            except OSError:
                pass


def cache_dir() -> Path | None:
    """Where compiled templates are kept between processes, or None for no such cache.

    `ATTNTRACE_CACHE_DIR` names the folder (empty or `off` turns the cache off); otherwise
    `$XDG_CACHE_HOME/attntrace` or `~/.cache/attntrace`. Templates live in a subfolder
    `jinja`; nothing is ever written into the installed package.
    """
    explicit = os.environ.get("ATTNTRACE_CACHE_DIR")
    if explicit is not None:
        if explicit.strip().lower() in ("", "0", "off", "no", "false", "none"):
            return None
        return Path(explicit).expanduser() / "jinja"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "attntrace" / "jinja"
    try:
        return Path.home() / ".cache" / "attntrace" / "jinja"
    except (RuntimeError, KeyError, OSError):  # no home folder: no cache
        return None


def _bytecode_cache(folder: Path | None, options: dict[str, Any]) -> jinja2.BytecodeCache | None:
    """A bytecode cache in `folder` if it is (or can be made) a private, writable folder of this
    user; None (compile from source, silently) otherwise. A folder other users can write to is
    refused: loading compiled templates from it would run their code."""
    if folder is None:
        return None
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
        if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
            return None
        if not os.access(folder, os.W_OK | os.X_OK):
            return None
        if _PACKAGE_ROOT in (folder.resolve(), *folder.resolve().parents):
            return None
    except (OSError, RuntimeError, ValueError):
        return None
    # the environment class is part of it: sandboxed code and plain code never share a file
    fingerprint = hashlib.sha1(repr((jinja2.__version__, ReportEnvironment.__name__, "immutable-bounded-1",
                                     sorted(options.items()))).encode()).hexdigest()[:10]
    return _QuietBytecodeCache(str(folder), f"{fingerprint}-%s.cache")


#: Rendering with a user's template folder may take at most this long, in seconds (the CLI,
#: on POSIX: a SIGALRM timer while no other timer or SIGALRM handler is in use).
TEMPLATE_TIME_LIMIT = 60.0


def cached_environment(template_dirs: list[str | os.PathLike], **options: Any) -> jinja2.Environment:
    """The environment loading from `template_dirs` (the first folder holding a name wins),
    built once per (folders as absolute paths, options, bytecode cache folder) and reused.
    `options` go to jinja2.Environment on top of `ENV_OPTIONS`."""
    folders = tuple(os.path.abspath(os.fspath(d)) for d in template_dirs)
    options = {**ENV_OPTIONS, **options}
    bcc_folder = cache_dir()
    key = (folders, tuple(sorted(options.items(), key=lambda kv: kv[0])), None if bcc_folder is None else str(bcc_folder))
    with _LOCK:
        env = _ENVIRONMENTS.get(key)
        if env is not None:
            _ENVIRONMENTS.move_to_end(key)
            return env
    loader = _OverlayLoader([FolderLoader(f) for f in folders])
    env = ReportEnvironment(loader=loader, auto_reload=True, bytecode_cache=_bytecode_cache(bcc_folder, options), **options)
    with _LOCK:
        env = _ENVIRONMENTS.setdefault(key, env)
        while len(_ENVIRONMENTS) > _MAX_ENVIRONMENTS:
            _ENVIRONMENTS.popitem(last=False)
    return env


def clear() -> None:
    """Forget the environments of this process (the bytecode cache on disk stays)."""
    with _LOCK:
        _ENVIRONMENTS.clear()


# ----------------------------------------------------------------------------- template errors

#: A template error message is cut to this many characters.
MAX_MESSAGE = 300


def _template_name(filename: str | None, folders: tuple[str, ...]) -> str | None:
    """`md/report.j2` for a file in one of `folders`; None for a file that is no template. The
    last folder is the shipped one: its templates are named `md/report.j2 (built-in)`."""
    if not filename:
        return None
    path = os.path.abspath(filename)
    for i, folder in enumerate(folders):
        if path.startswith(folder.rstrip(os.sep) + os.sep):
            name = os.path.relpath(path, folder).replace(os.sep, "/")
            return name + " (built-in)" if i == len(folders) - 1 and len(folders) > 1 else name
    return None


def _message(exc: BaseException) -> str:
    from attntrace.inputs.safetext import one_line

    if isinstance(exc, jinja2.TemplateNotFound):
        text = f"template {exc.name!r} not found"
    elif isinstance(exc, RecursionError):
        text = "macros or includes call each other without end (recursion too deep)"
    elif isinstance(exc, MemoryError):
        text = "out of memory"
    elif isinstance(exc, (jinja2.TemplateError, SecurityError)):
        text = str(getattr(exc, "message", None) or exc)
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    text = one_line(text)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def describe_template_error(exc: BaseException, folders: tuple[str, ...]) -> str | None:
    """``template md/report.j2, line 3: message`` for an error raised in (or while loading)
    a template of `folders`; None when no template is at fault (the error came from Python)."""
    if isinstance(exc, jinja2.TemplateSyntaxError):
        name = _template_name(exc.filename, folders) or exc.name or "?"
        return f"template {name}, line {exc.lineno}: {_message(exc)}"
    import traceback  # only when a template failed

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _template_name(f.filename, folders)]
    if not frames:
        if isinstance(exc, TemplateLimit):  # raised while joining the output: no template line
            return f"template {_template_name(getattr(exc, 'template_file', None), folders) or '?'}: {_message(exc)}"
        return None
    frame = frames[-1]  # the innermost template line: where the error happened
    return f"template {_template_name(frame.filename, folders)}, line {frame.lineno}: {_message(exc)}"


@contextmanager
def user_template_errors(env: jinja2.Environment, template_dir: str | os.PathLike | None) -> Iterator[None]:
    """Around a render: with a user's template folder, an error a template raised becomes
    BadInput ``template md/report.j2, line 3: ...`` (the user's template is at fault, not
    attntrace). Without one, errors pass unchanged (a shipped template's error is a bug).
    Either way the render is `one_render`: each template file is checked once."""
    if template_dir is None:
        with one_render():
            yield
        return
    timer = _Timer()
    try:
        timer.start()
        with one_render():
            yield
    except AttntraceError:
        raise
    except (Exception, RecursionError) as exc:  # noqa: BLE001 - re-raised unless a template is at fault
        loaders = getattr(env.loader, "loaders", [env.loader])
        folders = tuple(os.path.abspath(p) for ld in loaders for p in getattr(ld, "searchpath", ()))
        message = describe_template_error(exc, folders)
        if message is None:
            raise
        raise BadInput(message) from None
    finally:
        timer.stop()


class _Timer:
    """SIGALRM after `TEMPLATE_TIME_LIMIT` seconds, raising TemplateLimit in the template that
    runs; only in the main thread, and only when no timer and no SIGALRM handler are in use
    (a test runner's own timeout, an outer render's timer)."""

    def __init__(self) -> None:
        self.previous = None

    def start(self) -> None:
        import signal

        if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
            return
        if signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0) or signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL:
            return

        def expired(signum, frame):
            raise TemplateLimit(f"rendering took longer than {TEMPLATE_TIME_LIMIT:g} s")

        self.previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, TEMPLATE_TIME_LIMIT)

    def stop(self) -> None:
        if self.previous is None:
            return
        import signal

        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)
        self.previous = None
