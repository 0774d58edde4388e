"""`oncelog bench`: each performance figure measured against a reference in the same process."""
