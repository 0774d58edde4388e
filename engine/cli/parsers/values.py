"""Argument types that refuse a bad value while parsing: one usage line, before any import."""

from __future__ import annotations

import argparse
import math


def seconds(text: str) -> float:
    """A duration in seconds: finite and not negative (0: do not wait)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number of seconds, 0 or more")
    return value


def positive_seconds(text: str) -> float:
    """A duration in seconds that must let something happen: finite and above 0."""
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value
