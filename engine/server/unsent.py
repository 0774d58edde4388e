"""The bytes held for responses clients have not taken yet, and the one budget they share.

Why: a client that sends a Fetch and never reads keeps its response in the server's
memory until write_timeout_ms drops it, and 150 such clients asking for 55 MB each
would hold 8 GB. So every byte held for an unsent response is counted here, whatever
holds it:

- a frame's own bytes, and the whole of every buffer its views of stored batches are
  cut from (protocol.Frame.held_bytes): a view keeps all of its buffer alive;
- what writing it holds beside: a connection writes a frame a chunk at a time and waits
  for each to leave, so the transport copies at most one chunk the kernel has not
  taken, and a chunk joined from small pieces is one more (connection.WRITE_CHUNK_BYTES);
- while a fetch reads, the chunks of the segment its read fills beside the batches it
  keeps (fetch.READ_SLACK_BYTES).

A response is counted from before its bytes exist (a fetch reserves before it reads)
until the kernel has taken its last byte, or its connection is dropped.

Fetches take only what is free: when too little is, a fetch is not read at all; it
waits for room (room()), or answers without records when its max_wait runs out, so a
stalled reader gets nothing more while the budget is spent. Other responses are small
and answer requests a connection sends one at a time; they are counted (take()) but
never wait. The one way past the limit: a response may hold more than is free when it
is the only one held (a batch larger than the whole budget must still reach its
consumer).
"""

from __future__ import annotations

import asyncio


class UnsentBytes:
    def __init__(self, limit_bytes: int):
        if limit_bytes <= 0:
            raise ValueError(f"the unsent-bytes limit must be positive, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        # The most ever held at once: what the bound promises, as counted.
        self.peak_bytes = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def waiting(self) -> int:
        """Fetches waiting for room."""
        return sum(not waiter.done() for _, waiter in self._waiters)

    def free_bytes(self) -> int:
        return max(self.limit_bytes - self.held_bytes, 0)

    def reserve(self, wanted_bytes: int, minimum_bytes: int) -> int:
        """Take up to `wanted_bytes` (> 0) if `minimum_bytes` are free or nothing is held; 0 if not."""
        if self.held_bytes and self.free_bytes() < minimum_bytes:
            return 0
        granted = min(wanted_bytes, self.free_bytes())
        self.take(granted)
        return granted

    def grow(self, holding_bytes: int, more_bytes: int) -> bool:
        """Add `more_bytes` to a holding of `holding_bytes` if they are free or it is all that is held."""
        if more_bytes > self.free_bytes() and self.held_bytes != holding_bytes:
            return False
        self.take(more_bytes)
        return True

    def take(self, size_bytes: int) -> None:
        """Count `size_bytes` whatever is free (responses that never wait)."""
        self.held_bytes += size_bytes
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def release(self, size_bytes: int) -> None:
        """Give back `size_bytes`; wake the fetches now room is made for them."""
        self.held_bytes -= size_bytes
        assert self.held_bytes >= 0, self.held_bytes
        free = self.free_bytes()
        waiting = []
        for minimum, waiter in self._waiters:
            if waiter.done():
                continue  # timed out
            if minimum <= free or not self.held_bytes:
                waiter.set_result(None)
            else:
                waiting.append((minimum, waiter))
        self._waiters = waiting

    def room(self, minimum_bytes: int) -> asyncio.Future[None]:
        """Done once `minimum_bytes` are free or nothing is held (or wake_all); cancel it to stop waiting."""
        waiter = asyncio.get_running_loop().create_future()
        if minimum_bytes <= self.free_bytes() or not self.held_bytes:
            waiter.set_result(None)
        else:
            self._waiters.append((minimum_bytes, waiter))
        return waiter

    def wake_all(self) -> None:
        """Wake every waiting fetch (a shutdown: they answer with what they have)."""
        for _, waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters = []
