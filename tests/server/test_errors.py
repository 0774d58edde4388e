"""The Kafka error code each engine error gets over the wire (server.errors)."""

from __future__ import annotations

import errno

import pytest
from kio.schema.errors import ErrorCode

from oncelog import (
    InvalidRecordError,
    LogFailedError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    TooManyOpenFilesError,
)
from oncelog.server.errors import error_code_for


@pytest.mark.parametrize(
    ("error", "code"),
    [
        # At the open-files limit a read is retried by the client, not reported as unknown.
        (TooManyOpenFilesError(errno.EMFILE, "reopening", "/r/t-0/0.log"), ErrorCode.kafka_storage_error),
        (LogFailedError("fsync failed"), ErrorCode.kafka_storage_error),
        (RecordTooLargeError("big"), ErrorCode.message_too_large),  # before its base class
        (InvalidRecordError("control batch"), ErrorCode.invalid_record),
        (OutOfOrderSequenceError("gap"), ErrorCode.out_of_order_sequence_number),
        (OSError(errno.EIO, "raw"), ErrorCode.unknown_server_error),
    ],
)
def test_each_engine_error_gets_its_kafka_code(error: BaseException, code: ErrorCode) -> None:
    assert error_code_for(error) == code
