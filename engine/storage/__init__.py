"""oncelog.storage: the persistent layer below producer state.

`fs` is the filesystem seam every persistent byte goes through (the real OS; the
fault-injecting twin lives in `oncelog.torture.faultfs`); `lmdb_store` the LMDB
metadata store behind it; `os_locks` and `log_dirs` the directory locks; `snapshot`
the producer-state snapshot files, whose rows `producer_row` lays out; `checkpoint`
what a log records about itself durably (recovery point, log start); `metadata_values`
how values are read from a store; `partition_store` a partition's store, opened for
writing on first commit; `clean_marker` the clean-shutdown marker and the store copy it
carries. Nothing here knows Kafka's producer rules.
"""
