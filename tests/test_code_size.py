"""Size gates beside ruff's (C901 complexity, PLR0915 statements, set in pyproject.toml).

A function longer than LONG_LINES lines (its docstring aside) is the exception: it
says why, with a comment starting "Long on purpose:" inside it. So is a module longer
than LONG_MODULE_LINES: its docstring has a line starting "Long on purpose:".
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LONG_LINES = 70
MARK = "# Long on purpose:"
LONG_MODULE_LINES = 700
MODULE_MARK = "Long on purpose:"


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        assert first.end_lineno is not None
        return first.end_lineno - first.lineno + 1
    return 0


def _long_functions_without_a_reason() -> list[str]:
    found = []
    for folder in ("engine", "segments", "recovery"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text()
            lines = source.splitlines()
            for node in ast.walk(ast.parse(source)):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                assert node.end_lineno is not None
                body = lines[first - 1 : node.end_lineno]
                length = len(body) - _docstring_lines(node)
                if length > LONG_LINES and not any(MARK in line for line in body):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_every_function_over_the_limit_says_why_it_is_long() -> None:
    assert _long_functions_without_a_reason() == []


def _long_modules_without_a_reason() -> list[str]:
    found = []
    for folder in ("engine", "segments", "recovery"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text()
            length = len(source.splitlines())
            docstring = ast.get_docstring(ast.parse(source)) or ""
            reasoned = any(line.startswith(MODULE_MARK) for line in docstring.splitlines())
            if length > LONG_MODULE_LINES and not reasoned:
                found.append(f"{path.relative_to(ROOT)} ({length} lines)")
    return found


def test_every_module_over_the_limit_says_why_in_its_docstring() -> None:
    assert _long_modules_without_a_reason() == []
