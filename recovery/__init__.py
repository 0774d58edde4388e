"""oncelog.recovery: what a log does at open about a crash it may have suffered.

`plan` is the decision table: for each kind of damage (a torn tail, corruption below
the recovery point, a missing or stale snapshot, a lost store), what recovery does.
`loader` carries it out when a log opens. Both sit between producer state (which the
loader rebuilds) and `oncelog.log` (which opens through the loader); the files they
read and write are `oncelog.storage`'s.
"""
