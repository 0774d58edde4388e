"""The public names a broker imports from `oncelog`."""

from __future__ import annotations

import oncelog


def test_every_name_in_all_is_importable_from_oncelog() -> None:
    missing = [name for name in oncelog.__all__ if not hasattr(oncelog, name)]
    assert missing == []


def test_every_error_class_is_exported() -> None:
    errors = [
        name
        for name, value in vars(oncelog.errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == "oncelog.errors"
    ]
    assert sorted(set(errors) - set(oncelog.__all__)) == []
