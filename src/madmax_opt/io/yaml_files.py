"""Reading problem, plan and data files: YAML/JSON through libyaml with bounded nesting, unique keys and any
parser error as one line naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from madmax_opt.core.errors import ProblemError
from madmax_opt.io.limits import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
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


def read_text(path: Path, *, what: str, file: str, field: str | None = None) -> str:
    """A text file's contents; not found / a directory / unreadable / not UTF-8 become one-line errors."""
    named = what if str(path) == file else f"{what} {path}"
    if not path.exists():
        raise ProblemError(f"{what} not found (looked for {path.resolve()})", file=file, field=field)
    if path.is_dir():
        raise ProblemError(f"{named} is a directory; allowed: a file", file=file, field=field)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ProblemError(f"{named} has {path.stat().st_size:,} bytes; allowed: at most {MAX_FILE_BYTES:,}",
                               file=file, field=field)
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ProblemError(f"{named} is not UTF-8 text (byte {exc.start})", file=file, field=field) from None
    except OSError as exc:
        raise ProblemError(f"cannot read {named}: {exc.strerror}", file=file, field=field) from None


_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 10x faster, nesting capped at 1000


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
