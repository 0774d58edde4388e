"""tests/work_units.py: every heavy unit it names is a test that exists.

A renamed module or test would otherwise lose its place at the front of the queue, or
its unit of its own, with nothing to say so.
"""

from __future__ import annotations

import ast
from pathlib import Path

from work_units import HEAVY_S, unit_of, weight_s

REPO = Path(__file__).resolve().parent.parent


def test_every_heavy_unit_names_a_test_module_or_a_test_function_in_one() -> None:
    missing = []
    for key in HEAVY_S:
        module, _, function = key.partition("::")
        path = REPO / module
        if not path.is_file():
            missing.append(key)
            continue
        names = {
            node.name
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef)
        }
        if function and function not in names:
            missing.append(key)
    assert missing == []


def test_a_named_function_is_a_unit_per_parameter_and_the_rest_of_its_module_one_unit() -> None:
    heavy = next(key for key in HEAVY_S if "::" in key)
    module = heavy.split("::")[0]
    assert unit_of(f"{heavy}[0]") == f"{heavy}[0]" != unit_of(f"{heavy}[1]")
    assert weight_s(unit_of(f"{heavy}[1]")) == HEAVY_S[heavy]
    assert unit_of(f"{module}::test_something_else[x]") == module
    assert unit_of("tests/engine/test_log.py::TestAppend::test_one") == "tests/engine/test_log.py"
    assert weight_s("tests/engine/test_log.py") == 0.0
