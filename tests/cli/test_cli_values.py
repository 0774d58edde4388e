"""Bad option values are refused while parsing: one usage error, exit 2, nothing run."""

from __future__ import annotations

import argparse

import pytest

from oncelog.cli.main import main
from oncelog.cli.parsers.values import positive_seconds, seconds


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-1", "-0.5", "soon", ""])
def test_a_duration_that_is_not_a_finite_count_of_seconds_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        seconds(text)


def test_zero_seconds_means_do_not_wait_where_waiting_is_optional_only() -> None:
    assert seconds("0") == 0.0 and seconds("2.5") == 2.5
    with pytest.raises(argparse.ArgumentTypeError):
        positive_seconds("0")


@pytest.mark.parametrize(
    "argv",
    [
        ["recover", "ROOT", "--lock-timeout", "nan"],
        ["recover", "ROOT", "--lock-timeout", "-1"],
        ["topics", "--timeout-s", "0", "list"],
        ["groups", "--timeout-s", "-3", "list"],
    ],
)
def test_the_command_refuses_the_value_before_it_runs(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: argument {argv[-2] if argv[0] == 'recover' else '--timeout-s'}" in err
