"""The tests run `oncelog serve` with the same subprocess wrapper as the wire benchmark and the demo."""

from oncelog.bench.serve_process import ServeProcess, free_port

__all__ = ["ServeProcess", "free_port"]
