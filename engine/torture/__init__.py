"""The fault-injecting twin of the filesystem seam and the crash torture harness built on it."""
