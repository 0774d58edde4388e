"""What the README and the docstrings claim about the code, checked against the code.

Paths named in backticks must exist; dotted names of oncelog must import; the rule
table that opens engine/_append.c must name C functions the file defines and Python
functions that exist. A rename that leaves a claim behind fails here.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", "bench/README.md"]
# A path in the repository: a top folder of it, then more of a path.
_PATH = re.compile(r"`((?:engine|segments|recovery|bench|tests)/[A-Za-z0-9_./-]+)`")
_DOTTED = re.compile(r"`(oncelog(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")


def _resolve(dotted: str) -> object:
    """The module, or the attribute of the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(dotted)


def _texts() -> dict[str, str]:
    texts = {name: (ROOT / name).read_text() for name in DOCUMENTS}
    texts["engine/__init__.py"] = (ROOT / "engine/__init__.py").read_text()
    return texts


@pytest.mark.parametrize("document", [*DOCUMENTS, "engine/__init__.py"])
def test_every_path_named_in_backticks_exists(document: str) -> None:
    text = _texts()[document]
    missing = sorted({p for p in _PATH.findall(text) if "*" not in p and not (ROOT / p.rstrip("/")).exists()})
    assert missing == []


@pytest.mark.parametrize("document", [*DOCUMENTS, "engine/__init__.py"])
def test_every_dotted_oncelog_name_in_backticks_resolves(document: str) -> None:
    unresolved = []
    for dotted in sorted(set(_DOTTED.findall(_texts()[document]))):
        try:
            _resolve(dotted)
        except (ImportError, AttributeError):
            unresolved.append(dotted)
    assert unresolved == []


def _rule_table() -> list[tuple[str, str]]:
    """(C function, Python name) per row of the table that opens engine/_append.c."""
    source = (ROOT / "engine/_append.c").read_text()
    header = source[: source.index("*/")]
    rows = re.findall(r"^ \*   .*?\s{2,}([a-z_]+)\s{2,}(oncelog\.[A-Za-z0-9_.]+)", header, re.M)
    return rows


def test_the_compiled_appends_rule_table_names_functions_that_exist_on_both_sides() -> None:
    source = (ROOT / "engine/_append.c").read_text()
    rows = _rule_table()
    assert len(rows) >= 8
    for c_function, python_name in rows:
        assert re.search(rf"^static [^;(]*\b{c_function}\(", source, re.M), c_function
        assert callable(_resolve(python_name)), python_name
