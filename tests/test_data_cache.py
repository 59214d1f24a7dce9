"""The catalogs' parse cache (io/data_cache.py): the same values as parsing, kept where Python keeps bytecode, used
only while the file's bytes are unchanged, never written where bytecode is not, and never in the way."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from madmax_opt.io import data_cache
from madmax_opt.io.data_cache import cache_path, cached_yaml, package_yaml
from madmax_opt.io.yaml_files import SAFE_LOADER

DATA = Path(__file__).resolve().parents[1] / "src" / "madmax_opt" / "data"
CATALOGS = ("gpus.yaml", "systems.yaml", "models.yaml", "serving_calibration.yaml", "training_families.yaml")


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Caches written (bytecode allowed) under a prefix in tmp_path, never beside the package."""
    prefix = tmp_path / "pycache"
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    return prefix


def _never_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed although the cache was current")

    monkeypatch.setattr(data_cache.yaml, "load", refuse)


@pytest.mark.parametrize("name", CATALOGS)
def test_every_catalog_reads_back_as_parsed(name: str, writes: Path, monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_bytes((DATA / name).read_bytes())
    parsed = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    assert cached_yaml(path) == parsed  # first read: parsed, cache written
    assert cache_path(path).is_file()
    _never_parse(monkeypatch)
    again = cached_yaml(path)
    assert again == parsed and repr(again) == repr(parsed)  # same keys in the same order, same number types


def test_the_cache_sits_where_bytecode_would(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "pkg" / "data" / "x.yaml"
    monkeypatch.setattr(sys, "pycache_prefix", None)
    assert cache_path(path) == path.parent / "__pycache__" / f"x.yaml.{sys.implementation.cache_tag}.marshal"
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "prefix"))
    assert cache_path(path) == Path(str(tmp_path / "prefix") + str(path.parent), cache_path(path).name)


def test_an_edited_file_is_parsed_again_whatever_its_times(writes: Path, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\nb: [x, y]\n")
    assert cached_yaml(path) == {"a": 1, "b": ["x", "y"]}
    stat = path.stat()
    path.write_text("a: 2\nb: [x, z]\n")  # the same size, the same modification time
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cached_yaml(path) == {"a": 2, "b": ["x", "z"]}


def test_nothing_is_written_where_python_writes_no_bytecode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "pycache"))
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    assert cached_yaml(path) == {"a": 1}
    assert not (tmp_path / "pycache").exists()


def test_a_broken_or_foreign_cache_is_replaced(writes: Path, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1.5\n")
    where = cache_path(path)
    where.parent.mkdir(parents=True)
    for junk in (b"", b"\x00garbage", b"\xe9" * 40):  # empty, not marshal, a marshal value that is no pair
        where.write_bytes(junk)
        assert cached_yaml(path) == {"a": 1.5}
    assert cached_yaml(path) == {"a": 1.5}


def test_an_unwritable_cache_folder_only_costs_the_parse(writes: Path, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: [1, 2]\n")
    cache_path(path).parent.parent.mkdir(parents=True)
    cache_path(path).parent.write_text("a file where the folder would go")
    assert cached_yaml(path) == {"a": [1, 2]}
    assert cached_yaml(path) == {"a": [1, 2]}


def test_values_marshal_cannot_write_are_parsed_every_time(writes: Path, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("when: 2024-01-02\n")
    first = cached_yaml(path)
    assert first == {"when": yaml.safe_load("when: 2024-01-02\n")["when"]}
    assert not cache_path(path).exists()
    assert cached_yaml(path) == first


def test_the_package_catalogs_go_through_the_cache(writes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = yaml.load((DATA / "systems.yaml").read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    assert package_yaml("systems.yaml") == parsed
    _never_parse(monkeypatch)
    assert package_yaml("systems.yaml") == parsed
