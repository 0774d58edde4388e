"""MarkerSyncs through the broker: a stored end's markers fsynced without holding up the partition.

The coordinator's side (when the fsync runs, what waits for it, retries) is in
test_txn_coordinator; the restart that writes a lost marker again is in test_wire_transactions.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from oncelog.layout import TopicPartition
from oncelog.log_manager import LogManager
from oncelog.server.broker import Broker, ServeConfig
from oncelog.storage.fs import OsFile

WAIT_S = 30.0


def test_the_fsync_of_a_stored_ends_markers_does_not_hold_up_appends_to_the_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next transaction's appends land on the event loop while the last end's markers are
    fsynced in a worker thread: a sync holding the log's append lock would stall the loop."""
    held, entered = threading.Event(), threading.Event()

    def gated(real: Any) -> Any:
        def sync(self: OsFile) -> None:
            if not held.is_set():
                entered.set()
                held.wait(WAIT_S)
            real(self)

        return sync

    with LogManager.open(tmp_path / "root", progress=False) as manager:
        broker = Broker(manager, ServeConfig(listen_port=0))
        try:
            asyncio.run(broker.create_topic("out", 1))
            log = broker.log("out", 0)
            log.append_records([(b"k", b"marker's stand-in")])
            assert log.durable_end_offset == 0
            monkeypatch.setattr(OsFile, "fdatasync", gated(OsFile.fdatasync))
            monkeypatch.setattr(OsFile, "fsync", gated(OsFile.fsync))
            syncing = threading.Thread(target=broker._sync_partition, args=(TopicPartition("out", 0), 1))
            syncing.start()
            assert entered.wait(WAIT_S), "the sync never reached its fsync"
            appending = threading.Thread(target=log.append_records, args=([(b"k", b"next")],))
            appending.start()
            appending.join(WAIT_S)
            assert not appending.is_alive(), "the append waited for the markers' fsync"
            assert log.log_end_offset == 2
            held.set()
            syncing.join(WAIT_S)
            assert not syncing.is_alive() and log.durable_end_offset >= 1
        finally:
            held.set()
            broker.close()
