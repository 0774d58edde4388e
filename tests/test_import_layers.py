"""Every module of oncelog has a layer in the import contracts (pyproject.toml).

`make imports` (part of `make test`) has import-linter check the contracts; a module
missing from them would escape the check, so this test fails when one is added
without a layer.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where each folder's modules live in the installed package (pyproject's package-dir).
FOLDERS = {"engine": "oncelog", "segments": "oncelog.segments", "recovery": "oncelog.recovery"}
# Package initialisers that only gather names of their own layer.
INITIALISERS = {"oncelog", "oncelog.recovery", "oncelog.cli.__main__"}


def _every_module() -> set[str]:
    modules = set()
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT / folder).with_suffix("")
            parts = [part for part in relative.parts if part != "__init__"]
            name = ".".join([package, *parts])
            if not (folder == "engine" and parts and parts[0] in ("segments", "recovery")):
                modules.add(name)
    return modules


def _contracts() -> list[dict[str, list[str]]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, list[str]]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _within(module: str, packages: list[str]) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def test_every_module_belongs_to_exactly_one_layer() -> None:
    codec, core, outer = _contracts()[:3]
    upper = [name.strip() for layer in outer["layers"] for name in layer.split(":")]
    assert sorted(core["forbidden_modules"]) == sorted(upper)  # the core may import none of them
    layers = {
        "segments": lambda m: _within(m, codec["source_modules"]),
        "core": lambda m: m in core["source_modules"],
        "outer": lambda m: _within(m, upper),
    }
    unplaced, doubly = [], []
    for module in sorted(_every_module() - INITIALISERS):
        homes = [layer for layer, holds in layers.items() if holds(module)]
        if not homes:
            unplaced.append(module)
        elif len(homes) > 1:
            doubly.append((module, homes))
    assert unplaced == [], "add these modules to a contract in pyproject.toml"
    assert doubly == []


def test_the_core_list_names_only_modules_that_exist() -> None:
    core = _contracts()[1]
    assert sorted(set(core["source_modules"]) - _every_module()) == []
