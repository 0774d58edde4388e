"""The public names a broker imports from `oncelog`, and what importing costs."""

from __future__ import annotations

import importlib
import subprocess
import sys

import oncelog
from oncelog.errors import OncelogError


def test_every_name_in_all_is_importable_from_oncelog() -> None:
    missing = [name for name in oncelog.__all__ if not hasattr(oncelog, name)]
    assert missing == []


def test_all_and_the_lazy_table_name_the_same_things() -> None:
    assert sorted(oncelog.__all__) == sorted(oncelog._HOME)


def test_each_lazy_name_is_the_object_its_home_module_defines() -> None:
    for name, home in oncelog._HOME.items():
        module = importlib.import_module(home)
        expected = module if home == f"oncelog.{name}" else getattr(module, name)
        assert getattr(oncelog, name) is expected, name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        oncelog.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_every_error_class_is_exported() -> None:
    errors = [
        name
        for name, value in vars(oncelog.errors).items()
        if isinstance(value, type) and issubclass(value, OncelogError)
    ]
    assert len(errors) > 20
    assert sorted(set(errors) - set(oncelog.__all__)) == []


def _modules_loaded_by(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_importing_the_codec_loads_no_storage_or_presentation_library() -> None:
    loaded = _modules_loaded_by("import oncelog.segments")
    heavy = {name.split(".")[0] for name in loaded} & {
        "lmdb",
        "rich",
        "pyspark",
        "pyarrow",
        "matplotlib",
        "msgpack",
    }
    assert heavy == set()
    outside = {
        name for name in loaded if name.startswith("oncelog.") and not name.startswith("oncelog.segments")
    }
    assert outside == set()


def test_importing_the_package_loads_none_of_its_modules() -> None:
    loaded = _modules_loaded_by("import oncelog")
    assert {name for name in loaded if name.startswith("oncelog.")} == set()


def test_opening_a_log_loads_no_presentation_library() -> None:
    loaded = _modules_loaded_by("import oncelog.log, oncelog.log_manager")
    assert {name.split(".")[0] for name in loaded} & {"rich", "pyspark", "matplotlib"} == set()
