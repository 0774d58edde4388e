"""Read-only inspection of partition directories, shared by the CLI and the Spark source.

Nothing here changes a log: every file is opened through `ReadOnlyFileSystem`.
"""
