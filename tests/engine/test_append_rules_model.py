"""Brief §4's append rules as a tiny pure-Python model, checked against a real Log.

A hypothesis state machine drives 2-3 idempotent producers through in-order
appends, retries of recent batches, gaps, epoch bumps, zombie epochs, new
producers at arbitrary sequences (some near 2**31-1, for wraparound), requests of
two batches, rolls, clean close+reopen, and idle time on the engine's clock.
Each producer's client clock is its own: current, years behind, days or years
ahead, jittered by hours from batch to batch. Expiry follows the engine's clock
alone (brief §6), so the model forgets a producer exactly when the engine has not
appended for it in EXP. Every action's outcome (offsets, duplicate flag, or which
exception) must equal the model's, and after every step each producer's epoch,
5-batch window, last append time and last batch timestamp must equal the model's.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from oncelog.config import LogConfig
from oncelog.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from oncelog.log import Log
from oncelog.segments.batch import encode_batch

MAX_SEQ = 2**31 - 1
MODULUS = 2**31
WINDOW = 5
T0 = 1_700_000_000_000
PIDS = (11, 22, 33)
DAY_MS = 24 * 3600 * 1000
YEAR_MS = 365 * DAY_MS
EXP = DAY_MS  # producer_expiration_ms, Kafka's default
# How far a producer's client clock is from the engine's.
CLIENT_SKEWS_MS = (0, -2 * YEAR_MS, 3 * DAY_MS, -10 * YEAR_MS, 10 * YEAR_MS)
START_SEQS = (0, 1, 12345, MAX_SEQ - 4, MAX_SEQ - 2, MAX_SEQ - 1, MAX_SEQ)

# (first_seq, last_seq, first_offset, last_offset)
Cached = tuple[int, int, int, int]
# ("ok" | "dup", first_offset, last_offset) or ("epoch" | "order",)
Outcome = tuple[object, ...]


@dataclasses.dataclass(frozen=True)
class Send:
    pid: int
    epoch: int
    seq: int
    count: int

    @property
    def last_seq(self) -> int:
        return (self.seq + self.count - 1) % MODULUS


@dataclasses.dataclass
class ProducerModel:
    epoch: int
    window: list[Cached]
    last_append_ms: int  # the engine's clock
    last_timestamp_ms: int  # the newest batch's, the client's clock


@dataclasses.dataclass
class Model:
    """Brief §4 for client appends and §6's expiry on the engine's clock, nothing more."""

    log_end: int = 0
    producers: dict[int, ProducerModel] = dataclasses.field(default_factory=dict)

    def expire(self, now: int) -> None:
        self.producers = {p: s for p, s in self.producers.items() if now - s.last_append_ms < EXP}

    def apply(self, send: Send, ts: int, now: int) -> Outcome:
        state = self.producers.get(send.pid)
        if state is not None:
            if send.epoch < state.epoch:
                return ("epoch",)
            if send.epoch > state.epoch:
                if send.seq != 0:
                    return ("order",)
            else:
                for first_seq, last_seq, first_off, last_off in state.window:
                    if (first_seq, last_seq) == (send.seq, send.last_seq):
                        return ("dup", first_off, last_off)
                last = state.window[-1][1] if state.window else -1
                if not (send.seq == last + 1 or (send.seq == 0 and last == MAX_SEQ)):
                    return ("order",)
        first, last_offset = self.log_end, self.log_end + send.count - 1
        self.log_end = last_offset + 1
        if state is None or send.epoch != state.epoch:
            state = ProducerModel(send.epoch, [], now, ts)
            self.producers[send.pid] = state
        state.window = [*state.window, (send.seq, send.last_seq, first, last_offset)][-WINDOW:]
        state.last_append_ms, state.last_timestamp_ms = now, ts
        return ("ok", first, last_offset)

    def apply_request(self, sends: list[Send], stamps: list[int], now: int) -> list[Outcome] | Outcome:
        """All or nothing: the first refused batch refuses the request."""
        trial = copy.deepcopy(self)
        outcomes = []
        for send, ts in zip(sends, stamps, strict=True):
            outcome = trial.apply(send, ts, now)
            if outcome[0] in ("epoch", "order"):
                return outcome
            outcomes.append(outcome)
        self.log_end, self.producers = trial.log_end, trial.producers
        return outcomes


def encode(send: Send, ts: int) -> bytes:
    records = [(f"{send.pid}:{send.epoch}:{send.seq}:{i}".encode(), b"x") for i in range(send.count)]
    return encode_batch(
        records,
        producer_id=send.pid,
        producer_epoch=send.epoch,
        base_sequence=send.seq,
        timestamp_ms=ts,
    )


def outcome_of(log: Log, sends: list[Send], stamps: list[int]) -> list[Outcome] | Outcome:
    try:
        batches = [encode(s, ts) for s, ts in zip(sends, stamps, strict=True)]
        # One batch goes through the fast path (Log.append), two through append_batches.
        results = [log.append(batches[0])] if len(batches) == 1 else log.append_batches(batches)
    except InvalidProducerEpochError:
        return ("epoch",)
    except OutOfOrderSequenceError:
        return ("order",)
    return [("dup" if r.duplicate else "ok", r.first_offset, r.last_offset) for r in results]


CONFIG = LogConfig(segment_index_bytes=4096, segment_bytes=4096, producer_expiration_ms=EXP)


class AppendRulesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="oncelog-model-")
        # The log's clock is the model's (the engine's); batch timestamps are each
        # producer's client clock, which is not.
        self.clock = T0
        self.log = Log.open(self.directory, CONFIG, clock=lambda: self.clock)
        self.model = Model()
        self.history: dict[int, list[Send]] = {}  # every accepted batch per producer
        self.starts: dict[int, int] = dict.fromkeys(PIDS, 0)
        self.skews: dict[int, int] = dict.fromkeys(PIDS, 0)
        self.jitter = False
        self.stamps = 0

    # -- helpers ----------------------------------------------------------------
    def _next(self, pid: int) -> Send:
        """The in-order batch `pid` would send next (epoch 0 at its start sequence when new)."""
        state = self.model.producers.get(pid)
        if state is None:
            return Send(pid, 0, self.starts[pid], 1)
        last = state.window[-1][1] if state.window else -1
        return Send(pid, state.epoch, (last + 1) % MODULUS, 1)

    def _stamp(self, pid: int) -> int:
        """The batch timestamp `pid`'s client clock gives now: skewed, and jittered by hours."""
        self.stamps += 1
        jitter = (self.stamps * 7919 % 13 - 6) * 3600 * 1000 if self.jitter else 0
        return self.clock + self.skews[pid] + jitter

    def _do(self, *sends: Send) -> None:
        self.clock += 1
        if any(self.clock - s.last_append_ms >= EXP for s in self.model.producers.values()):
            # The append path expires lazily (the ring's head, never early); the model is
            # exact, so every producer past its expiration goes first, by both.
            self.log.expire_producers(exhaustive=True)
            self.model.expire(self.clock)
        stamps = [self._stamp(send.pid) for send in sends]
        expected = self.model.apply_request(list(sends), stamps, self.clock)
        got = outcome_of(self.log, list(sends), stamps)
        assert got == expected, (sends, got, expected)
        if isinstance(expected, list):
            for send, outcome in zip(sends, expected, strict=True):
                if outcome[0] == "ok":
                    self.history.setdefault(send.pid, []).append(send)

    # -- rules ------------------------------------------------------------------
    @initialize(
        starts=st.lists(st.sampled_from(START_SEQS), min_size=len(PIDS), max_size=len(PIDS)),
        skews=st.lists(st.sampled_from(CLIENT_SKEWS_MS), min_size=len(PIDS), max_size=len(PIDS)),
        jitter=st.booleans(),
    )
    def choose_start_sequences_and_client_clocks(
        self, starts: list[int], skews: list[int], jitter: bool
    ) -> None:
        # Where each producer starts when an in-order rule meets it first; near MAX it soon wraps.
        self.starts = dict(zip(PIDS, starts, strict=True))
        self.skews = dict(zip(PIDS, skews, strict=True))
        self.jitter = jitter

    @rule(idle=st.sampled_from((1, EXP // 3, EXP - 2, EXP, EXP + 1, 3 * EXP)))
    def engine_clock_advances(self, idle: int) -> None:
        self.clock += idle

    @rule(pid=st.sampled_from(PIDS), count=st.integers(1, 3))
    def append_in_order(self, pid: int, count: int) -> None:
        self._do(dataclasses.replace(self._next(pid), count=count))

    @rule(pid=st.sampled_from(PIDS), back=st.integers(1, 7))
    def retry_recent_batch(self, pid: int, back: int) -> None:
        sent = self.history.get(pid, [])
        if len(sent) >= back:
            self._do(sent[-back])
        else:
            self._do(self._next(pid))

    @rule(pid=st.sampled_from(PIDS), gap=st.integers(1, 3), count=st.integers(1, 2))
    def append_with_gap(self, pid: int, gap: int, count: int) -> None:
        nxt = self._next(pid)
        self._do(Send(pid, nxt.epoch, (nxt.seq + gap) % MODULUS, count))

    @rule(
        pid=st.sampled_from(PIDS),
        bump=st.integers(1, 2),
        seq=st.sampled_from((0, 0, 1, 5)),
        count=st.integers(1, 3),
    )
    def append_with_bumped_epoch(self, pid: int, bump: int, seq: int, count: int) -> None:
        self._do(Send(pid, self._next(pid).epoch + bump, seq, count))

    @rule(pid=st.sampled_from(PIDS), drop=st.integers(1, 2), retry=st.booleans())
    def append_with_older_epoch(self, pid: int, drop: int, retry: bool) -> None:
        nxt = self._next(pid)
        sent = self.history.get(pid, [])
        seq = sent[-1].seq if retry and sent else nxt.seq
        self._do(Send(pid, max(nxt.epoch - drop, 0), seq, 1))

    @precondition(lambda self: len(self.model.producers) < len(PIDS))
    @rule(data=st.data(), seq=st.sampled_from(START_SEQS), epoch=st.integers(0, 3), count=st.integers(1, 3))
    def new_producer_at_any_sequence(self, data: st.DataObject, seq: int, epoch: int, count: int) -> None:
        unknown = [p for p in PIDS if p not in self.model.producers]
        pid = data.draw(st.sampled_from(unknown))
        self._do(Send(pid, epoch, seq, count))

    @rule(first=st.sampled_from(PIDS), second=st.sampled_from(PIDS), retry_second=st.booleans())
    def request_of_two_batches(self, first: int, second: int, retry_second: bool) -> None:
        one = self._next(first)
        if retry_second:
            two = one if first == second else self._next(second)
        elif first == second:
            two = Send(second, one.epoch, (one.seq + 1) % MODULUS, 1)
        else:
            two = dataclasses.replace(self._next(second), seq=(self._next(second).seq + 1) % MODULUS)
        self._do(one, two)

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def close_and_reopen(self) -> None:
        self.log.close()
        self.log = Log.open(self.directory, CONFIG, clock=lambda: self.clock)
        assert self.log.recovery_report.clean
        self.model.expire(self.clock)  # a load expires every producer past its expiration

    # -- invariants -------------------------------------------------------------
    @invariant()
    def producer_state_matches_the_model(self) -> None:
        assert self.log.log_end_offset == self.model.log_end
        entries = {e.producer_id: e for e in self.log.producers()}
        assert set(entries) == set(self.model.producers)
        for pid, state in self.model.producers.items():
            entry = entries[pid]
            assert self.log.producer_state(pid) == entry
            got = [(b.first_sequence, b.last_sequence, b.first_offset, b.last_offset) for b in entry.batches]
            assert (entry.producer_epoch, got) == (state.epoch, state.window), pid
            assert entry.last_sequence == state.window[-1][1]
            assert entry.last_offset == state.window[-1][3]
            assert (entry.last_append_ms, entry.last_timestamp_ms) == (
                state.last_append_ms,
                state.last_timestamp_ms,
            )

    def teardown(self) -> None:
        try:
            self.log.close()
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


AppendRulesMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_append_rules_match_the_model = AppendRulesMachine.TestCase
