"""Reading input files (problem, plan, hf_config, overlay, runs, sweep, fleet and sweep-result files): regular
files only, symlink loops caught, a size cap; YAML/JSON through libyaml with bounded nesting and unique keys; every
error one line naming the file."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.limits import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_SHOWN_CHARS,
)

# ------------------------------------------------------------------------------------------- loading


def read_yaml(path: str | Path, what: str = "file") -> Any:
    """Parse a YAML (or JSON) file; a missing, unreadable or malformed file is a one-line ProblemError."""
    text = read_text(Path(path), what=what, file=str(path))
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ProblemError(f"malformed YAML at {where}: {problem}", file=str(path)) from None
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:  # a constructor's error:
        # a timestamp such as 2024-13-45, an unhashable key, an integer of more than 4,300 digits
        raise ProblemError(f"malformed YAML: {type(exc).__name__}: {exc}", file=str(path)) from None


def read_text(path: Path, *, what: str, file: str, field: str | None = None,
              max_bytes: int = MAX_FILE_BYTES) -> str:
    """A text input file's contents through :func:`read_input_bytes`; not UTF-8 is a one-line error too."""
    data = read_input_bytes(path, what=what, file=file, field=field, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        named = what if str(path) == file else f"{what} {path}"
        raise ProblemError(f"{named} is not UTF-8 text (byte {exc.start})", file=file, field=field) from None


def read_input_bytes(path: Path, *, what: str, file: str, field: str | None = None,
                     max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The one way an input file is read: a regular file only (a FIFO, device, socket or directory would block,
    never end or fail late), symlinks followed with the kernel's loop check (ELOOP), at most ``max_bytes`` read
    (``/proc`` files report size 0, so the cap holds on the bytes read, not only on ``st_size``); every failure
    is one ProblemError line naming the path."""
    named = what if str(path) == file else f"{what} {path}"
    try:
        st = os.stat(path)  # follows symlinks; a loop is ELOOP here, never Python's RuntimeError
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise ProblemError(f"{what} not found (looked for {_absolute(path)})", file=file, field=field) from None
        raise ProblemError(f"cannot read {named}: {_reason(exc)}", file=file, field=field) from None
    if not stat.S_ISREG(st.st_mode):
        raise ProblemError(f"{named} is {_kind(st.st_mode)}; allowed: a regular file", file=file, field=field)
    if st.st_size > max_bytes:
        raise ProblemError(f"{named} has {st.st_size:,} bytes; allowed: at most {max_bytes:,}", file=file,
                           field=field)
    try:  # O_NONBLOCK: should the path become a FIFO between stat and open, open returns instead of waiting
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ProblemError(f"cannot read {named}: {_reason(exc)}", file=file, field=field) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ProblemError(f"{named} is {_kind(mode)}; allowed: a regular file", file=file, field=field)
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ProblemError(f"cannot read {named}: {_reason(exc)}", file=file, field=field) from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise ProblemError(f"{named} has more than {max_bytes:,} bytes; allowed: at most {max_bytes:,}", file=file,
                           field=field)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _reason(exc: OSError) -> str:
    """An OSError in words: a symlink loop named as such, else the system's message."""
    if exc.errno == errno.ELOOP:
        return "a symlink loop (too many levels of symbolic links)"
    return exc.strerror or type(exc).__name__


def _absolute(path: Path) -> str:
    """The absolute path, without resolving symlinks (Path.resolve raises RuntimeError on a loop in Python 3.11)."""
    return os.path.abspath(path)


def shorten(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """A value as an error message shows it: at most ``limit`` characters, the cut marked with its length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 10x faster, nesting capped at 1000
SAFE_LOADER: Any = _SafeLoader  # the package's own catalogs (yaml.load(text, Loader=SAFE_LOADER))


class _UniqueKeyLoader(_SafeLoader):
    """SafeLoader that rejects a key written twice in one mapping (PyYAML would silently keep the last) and
    nesting deeper than MAX_DEPTH (PyYAML's composer recurses once per level: 20,000 brackets overflow it; with
    libyaml, which stops at 1,000 levels, ``check_input`` applies MAX_DEPTH)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels; allowed: at most {MAX_DEPTH}", mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)
