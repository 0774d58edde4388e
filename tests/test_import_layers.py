"""The layers of oncelog, as pyproject.toml's import contracts state them.

`make imports` (part of `make test`) has import-linter check the contracts. These
tests check what the contracts alone cannot: that every module of oncelog sits in
exactly one layer (a module left out would escape the check), and that no two
modules import each other, directly or round a longer circle (the layers contract
allows imports within a layer), except under TYPE_CHECKING.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
# Where each folder's modules live in the installed package (pyproject's package-dir).
FOLDERS = {"engine": "oncelog", "segments": "oncelog.segments", "recovery": "oncelog.recovery"}
# The package itself gathers the public API from every layer; a script entry point.
OUTSIDE_LAYERS = {"oncelog", "oncelog.cli.__main__"}


def _every_module() -> set[str]:
    modules = set()
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT / folder).with_suffix("")
            parts = [part for part in relative.parts if part != "__init__"]
            modules.add(".".join([package, *parts]))
    return modules


def _layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [[name.strip() for name in layer.split(":")] for layer in contract["layers"]]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _installed_layout(tmp_path: Path) -> Path:
    """A tree of symlinks laid out as the installed package (grimp cannot follow package-dir)."""
    package = tmp_path / "oncelog"
    package.mkdir()
    for entry in (ROOT / "engine").iterdir():
        (package / entry.name).symlink_to(entry)
    for folder in ("segments", "recovery"):
        (package / folder).symlink_to(ROOT / folder)
    return tmp_path


def test_every_module_sits_in_exactly_one_layer() -> None:
    names = [name for layer in _layers() for name in layer]
    unplaced, doubly = [], []
    for module in sorted(_every_module() - OUTSIDE_LAYERS):
        homes = [name for name in names if _within(module, name)]
        if not homes:
            unplaced.append(module)
        elif len(homes) > 1:
            doubly.append((module, homes))
    assert unplaced == [], "add these modules to a layer in pyproject.toml"
    assert doubly == []


def test_every_layer_names_modules_that_exist() -> None:
    modules = _every_module()
    missing = [name for layer in _layers() for name in layer if not any(_within(m, name) for m in modules)]
    assert missing == []


def test_the_layers_run_from_the_command_line_down_to_the_codec() -> None:
    flat = [name for layer in _layers() for name in layer]
    order = ["oncelog.cli", "oncelog.bench", "oncelog.server", "oncelog.log_manager", "oncelog.log"]
    order += ["oncelog.recovery", "oncelog.producer_state", "oncelog.storage", "oncelog.segments"]
    assert [flat.index(name) for name in order] == sorted(flat.index(name) for name in order)


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return circles


def test_no_modules_import_each_other_outside_type_checking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = _installed_layout(tmp_path)
    monkeypatch.syspath_prepend(os.fspath(layout))
    for name in [name for name in sys.modules if _within(name, "oncelog")]:
        monkeypatch.delitem(sys.modules, name)
    graph = grimp.build_graph("oncelog", include_external_packages=False, exclude_type_checking_imports=True)
    assert "oncelog.recovery.loader" in graph.modules  # the layout, not the editable install
    assert _circles(graph) == []
