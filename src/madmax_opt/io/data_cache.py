"""The package's catalogs (``madmax_opt/data/*.yaml``) parsed through a cache kept the way Python keeps bytecode.

Parsing the catalogs with libyaml takes ~25 ms of every solve (gpus, systems, models, serving calibration; PyYAML's
constructor runs in Python); reading the same data back with ``marshal`` takes under 1 ms. The cache of a file
holds its parsed value and a key of what it was parsed from (blake2b of the file's bytes, the Python version, whose
``marshal`` format it is, and the PyYAML version that parsed it); a value is used only when the key of the file as
it is now matches, so an edited catalog is parsed again whatever its modification time. The cache lives where the
bytecode of the file's package would (``__pycache__`` beside the file, or under ``PYTHONPYCACHEPREFIX``) and is not
written where Python writes no bytecode (``PYTHONDONTWRITEBYTECODE``, ``-B``) or cannot write (a read-only install:
the file is parsed every time, as before). Only plain data is cached (what ``marshal`` writes: mappings, lists,
strings, numbers, booleans, None); anything else (a YAML timestamp) is parsed every time."""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from madmax_opt.io.yaml_files import SAFE_LOADER

_TAG = f"{sys.implementation.cache_tag}-pyyaml{yaml.__version__}-{SAFE_LOADER.__name__}".encode()
MARSHAL_VERSION = 4  # marshal's format since Python 3.4 (shared references kept)


def cache_path(path: Path) -> Path:
    """Where the parse of ``path`` is kept: importlib's rule for bytecode (``__pycache__`` beside the file, or the
    file's directory under ``sys.pycache_prefix``), named ``<file>.<cache tag>.marshal``."""
    name = f"{path.name}.{sys.implementation.cache_tag}.marshal"
    if sys.pycache_prefix:
        folder = Path(os.path.abspath(path.parent))
        return Path(sys.pycache_prefix, *folder.parts[1:], name)  # the root ('/', 'C:\\') dropped, as importlib does
    return path.parent / "__pycache__" / name


def parse_key(data: bytes) -> bytes:
    """What a parse depends on: the file's bytes, the marshal format (Python version) and the YAML parser."""
    return hashlib.blake2b(_TAG + b"\0" + data, digest_size=20).digest()


def cached_yaml(path: Path) -> Any:
    """``yaml.load(text, Loader=SAFE_LOADER)`` of the UTF-8 file at ``path``, from the cache when its key matches."""
    data = path.read_bytes()
    key = parse_key(data)
    where = cache_path(path)
    try:
        stored_key, value = marshal.loads(where.read_bytes())
        if stored_key == key:
            return value
    except (OSError, ValueError, EOFError, TypeError):  # no cache yet, unreadable, or not a (key, value) pair
        pass
    value = yaml.load(data.decode("utf-8"), Loader=SAFE_LOADER)  # libyaml when present
    if not sys.dont_write_bytecode:
        _write(where, key, value)
    return value


def _write(where: Path, key: bytes, value: Any) -> None:
    """Write the cache atomically (a temporary file renamed over it); nothing when it cannot be written."""
    try:
        blob = marshal.dumps((key, value), MARSHAL_VERSION)
    except ValueError:  # a value marshal cannot write (e.g. a datetime): parsed every time
        return
    tmp = where.with_name(f"{where.name}.{os.getpid()}.tmp")
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(blob)
        os.replace(tmp, where)
    except OSError:  # a read-only install or cache folder: parsed every time
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def package_yaml(filename: str) -> Any:
    """A catalog of the package (``madmax_opt/data/<filename>``) parsed, through the cache where it is a file."""
    from importlib import resources

    resource = resources.files("madmax_opt").joinpath("data").joinpath(filename)
    if isinstance(resource, Path):
        return cached_yaml(resource)
    return yaml.load(resource.read_text(), Loader=SAFE_LOADER)  # a zipped install: parsed every time


@cache
def package_entries(filename: str) -> dict[str, Any]:
    """A catalog file's entries by name (its top-level mapping; {} for an empty file), parsed once per process."""
    raw = package_yaml(filename)
    return raw if isinstance(raw, dict) else {}
