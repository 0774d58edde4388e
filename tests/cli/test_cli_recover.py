"""`oncelog recover ROOT`: explicit recovery of a root or one partition, with its summary."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from oncelog import LogConfig, LogManager, TopicPartition
from oncelog.cli.main import main
from oncelog.log import Log
from oncelog.segments.batch import encode_batch
from oncelog.storage.clean_marker import CLEAN_SHUTDOWN_FILE

T0 = 1_700_000_000_000
CONFIG = LogConfig()


def clock() -> int:
    return T0


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def make_root(root: Path, partitions: int = 3) -> None:
    with LogManager.open(root, CONFIG, clock=clock, progress=False) as manager:
        for p in range(partitions):
            log = manager.log("orders", p)
            for seq in range(0, 20, 2):
                values = [(b"k", b"v%d" % (seq + i)) for i in range(2)]
                log.append(encode_batch(values, producer_id=p + 1, producer_epoch=0, base_sequence=seq))


def segment_of(root: Path, partition: int) -> Path:
    return sorted((root / f"orders-{partition}").glob("*.log"))[0]


def test_recover_cuts_a_torn_tail_names_it_and_leaves_every_partition_clean(tmp_path: Path) -> None:
    make_root(tmp_path)
    for p in range(3):
        os.unlink(tmp_path / f"orders-{p}" / CLEAN_SHUTDOWN_FILE)  # as after a crash
    with segment_of(tmp_path, 2).open("ab") as segment:
        segment.write(b"\x00\x00\x00\x00\x00\x00\x00\x14\x00\x00\x01\x00torn")  # half a batch header
    status, out, err = run("recover", "--no-progress", str(tmp_path))
    assert status == 0, err
    assert "recovered 3 partitions" in out and "3 unclean" in out
    assert "orders-2: cut 16 bytes" in out
    assert all((tmp_path / f"orders-{p}" / CLEAN_SHUTDOWN_FILE).exists() for p in range(3))
    with LogManager.open(tmp_path, CONFIG, clock=clock, progress=False) as manager:
        assert manager.recovery_summary.clean == 3
        assert manager.log("orders", 2).log_end_offset == 20


def test_recover_json_lists_each_partition(tmp_path: Path) -> None:
    make_root(tmp_path, 2)
    status, out, _ = run("recover", "--json", "--threads", "2", str(tmp_path))
    assert status == 0
    summary = json.loads(out)
    assert summary["partitions"] == 2 and summary["threads"] == 2
    assert sorted(summary["partitions_detail"]) == ["orders-0", "orders-1"]
    assert summary["partitions_detail"]["orders-0"]["clean"] is True


def test_recover_of_one_partition_directory(tmp_path: Path) -> None:
    make_root(tmp_path, 1)
    os.unlink(tmp_path / "orders-0" / CLEAN_SHUTDOWN_FILE)
    status, out, _ = run("recover", str(tmp_path / "orders-0"))
    assert status == 0 and "recovered 1 partitions" in out and "1 unclean" in out


def test_corruption_below_the_recovery_point_fails_naming_file_and_position_until_truncate_is_asked(
    tmp_path: Path,
) -> None:
    make_root(tmp_path, 2)
    segment = segment_of(tmp_path, 1)
    os.unlink(tmp_path / "orders-1" / CLEAN_SHUTDOWN_FILE)
    os.truncate(segment, segment.stat().st_size // 2)  # fsynced bytes gone: not a torn write
    status, _, err = run("recover", "--no-progress", str(tmp_path))
    assert status == 1
    assert "FAILED orders-1: CorruptLogError" in err and str(segment) in err and "position" in err
    assert "--truncate-corrupt" in err
    status, out, err = run("recover", "--no-progress", "--truncate-corrupt", str(tmp_path))
    assert status == 0, err
    assert "orders-1: cut" in out
    with LogManager.open(tmp_path, CONFIG, clock=clock, progress=False) as manager:
        assert 0 < manager.log("orders", 1).log_end_offset < 20


def test_a_root_in_use_is_refused_with_exit_2(tmp_path: Path) -> None:
    make_root(tmp_path, 1)
    with LogManager.open(tmp_path, CONFIG, clock=clock, progress=False):
        status, _, err = run("recover", str(tmp_path))
    assert status == 2 and "already open" in err


def test_a_partition_held_by_another_log_fails_that_partition(tmp_path: Path) -> None:
    make_root(tmp_path, 2)
    with Log.open(tmp_path / "orders-0", CONFIG):
        status, _, err = run("recover", "--no-progress", "--lock-timeout", "0.1", str(tmp_path))
    assert status == 1 and f"FAILED {TopicPartition('orders', 0)}: LockTimeoutError" in err


def test_bad_input_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert run("recover", str(missing))[0] == 2
    assert not missing.exists()
    assert run("recover", "--threads", "0", str(tmp_path))[0] == 2
