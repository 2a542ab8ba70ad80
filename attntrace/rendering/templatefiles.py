"""Reading template files from a folder: inside the folder, regular files, bounded size.

A template folder may come from someone else (a shared folder, an unpacked archive). Jinja's
FileSystemLoader follows symbolic links anywhere (a `md/report.j2` linked to /etc/passwd
would be printed into the report), opens FIFOs and devices (blocking forever) and reads a
file of any size in full. `FolderLoader` reads a template only when its real path (symbolic
links resolved) lies inside the folder, only from a regular file, and only up to
`MAX_TEMPLATE_BYTES`; anything else is a one-line error naming the template.
"""

from __future__ import annotations

import os
import stat

import jinja2
from jinja2.loaders import split_template_path

#: The largest template file read (the largest shipped template is under 20 KB).
MAX_TEMPLATE_BYTES = 1 << 20


def _refuse(template: str, why: str) -> jinja2.TemplateSyntaxError:
    return jinja2.TemplateSyntaxError(why, 1, template)


def read_template_file(path: str, template: str) -> str:
    """The text of the regular file `path` (at most MAX_TEMPLATE_BYTES, UTF-8)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _refuse(template, f"cannot read the file: {exc.strerror or type(exc).__name__}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(template, "is not a regular file (a FIFO, device or folder); refused")
        if st.st_size > MAX_TEMPLATE_BYTES:
            raise _refuse(template, f"the file has {st.st_size:,} bytes, more than a template may have ({MAX_TEMPLATE_BYTES:,})")
        chunks, size = [], 0
        while size <= MAX_TEMPLATE_BYTES:
            chunk = os.read(fd, MAX_TEMPLATE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_TEMPLATE_BYTES:  # the file grew after fstat
            raise _refuse(template, f"the file has more than {MAX_TEMPLATE_BYTES:,} bytes, more than a template may have")
    except OSError as exc:
        raise _refuse(template, f"cannot read the file: {exc.strerror or type(exc).__name__}") from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(template, "the file is not UTF-8 text") from None


def inside(root: str, path: str) -> bool:
    """Whether `path` (a real path) is `root` (a real path) or lies under it."""
    try:
        return os.path.commonpath([root, path]) == root
    except ValueError:  # different drives
        return False


class FolderLoader(jinja2.FileSystemLoader):
    """FileSystemLoader that reads only regular files of bounded size whose real path stays in
    the folder: a symbolic link inside the folder to another file of the folder is fine; one
    that leaves it, a FIFO or an oversized file is refused in one line."""

    def get_source(self, environment, template):
        pieces = split_template_path(template)  # refuses ".." and absolute names
        for searchpath in self.searchpath:
            path = os.path.join(searchpath, *pieces)
            if not os.path.lexists(path) or os.path.isdir(path):
                continue
            root = os.path.realpath(searchpath)
            real = os.path.realpath(path)
            if not inside(root, real):
                raise _refuse(template, "is a symbolic link to a file outside the template folder; refused")
            source = read_template_file(real, template)
            try:
                mtime = os.path.getmtime(real)
            except OSError:
                mtime = None

            def uptodate() -> bool:
                try:
                    return os.path.realpath(path) == real and os.path.getmtime(real) == mtime
                except OSError:
                    return False

            return source, os.path.normpath(path), uptodate
        raise jinja2.TemplateNotFound(template)
