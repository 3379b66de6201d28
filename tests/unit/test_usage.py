"""The usage ledger's records, pure: attempts split by day and model, the summary's decay,
month and expected run time, chunks and their compaction, bounds on what is read, and the
ledger's size at 1,000 jobs a day for a year."""

from __future__ import annotations

import json

import pytest

from hypertf.core.errors import StoreError
from hypertf.core.fairshare import DAY_S, accrued
from hypertf.core.records import encode
from hypertf.core.usage import (
    CHUNK_BYTES,
    DETAIL_DAYS,
    Attempt,
    Chunk,
    Summary,
    attempt_of,
    compacted,
    day_start,
    model_name,
    parse_chunk_name,
    split_days,
)

H = 7 * DAY_S
MIDNIGHT = day_start("2026-11-26")


def attempt(user: str = "bob", gpus: int = 2, start: float = MIDNIGHT - 3600,
            end: float | None = MIDNIGHT + 1800, n: int = 1) -> Attempt:
    return Attempt(f"20261126-000000-{n:06d}.{user}", user, gpus, {"H100": gpus},
                   ("n1",), start, end, "succeeded", hosts_n=1)


def test_an_attempt_over_midnight_counts_in_both_days() -> None:
    assert split_days(MIDNIGHT - 3600, MIDNIGHT + 1800) == [("2026-11-25", 3600.0),
                                                          ("2026-11-26", 1800.0)]
    rows = attempt().per_day(now=MIDNIGHT + 7200)
    assert rows == [("2026-11-25", "bob", "H100", 7200.0), ("2026-11-26", "bob", "H100", 3600.0)]
    running = attempt(end=None).per_day(now=MIDNIGHT + 60, since=MIDNIGHT)
    assert running == [("2026-11-26", "bob", "H100", 120.0)]


def test_an_attempt_names_its_models_and_caps_its_hosts() -> None:
    placements = [(f"n{i}", (0, 1)) for i in range(40)]
    models = {(f"n{i}", g): "A100" if i % 2 else "H100\x1b[2J" for i in range(40) for g in (0, 1)}
    a = attempt_of("20261126-000000-aaaaaa.bob", placements, MIDNIGHT, models,
                   {"attempt": 3, "job_id": "../x", "share": 99, "usage": 0})
    assert a.gpus == 80 and a.models == {"A100": 40, "H100\x1b[2J": 40}
    assert len(a.hosts) == 16 and a.hosts_n == 40 and a.attempt == 3 and a.job_id == ""
    assert model_name("H100\x1b[2J") == "H100?[2J" and model_name(None) == "unknown"
    assert Attempt.from_json(json.loads(json.dumps(a.to_json()))).models == {
        "A100": 40, "H100?[2J": 40}


@pytest.mark.parametrize("bad", [
    {"key": "not a key"}, {"key": "20261126-000000-a.bob", "gpus": -1, "start": 1,
                           "models": {}, "hosts": []},
    {"key": "20261126-000000-a.bob", "gpus": 1, "start": "yesterday", "models": {},
     "hosts": []},
    {"key": "20261126-000000-a.bob", "gpus": 1, "start": 1.0, "models": {},
     "hosts": ["h"] * 1000},
    {"key": "20261126-000000-a.bob", "gpus": 1, "start": 1.0, "models": {"x": 1e30},
     "hosts": []},
])
def test_an_attempt_out_of_bounds_is_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        Attempt.from_json(bad)


def test_the_summary_decays_adds_the_month_and_learns_the_run_time() -> None:
    one = attempt(start=MIDNIGHT, end=MIDNIGHT + 3600)
    s = Summary().closed([one], MIDNIGHT + 3600, H)
    assert s.decayed("bob", MIDNIGHT + 3600, H) == pytest.approx(accrued(2, 0, 3600, H))
    assert s.decayed("bob", MIDNIGHT + 3600 + H, H) == pytest.approx(accrued(2, 0, 3600, H) / 2)
    assert s.month_used("bob", MIDNIGHT + 3600) == 7200.0
    assert s.expected["bob"] == 3600.0
    s2 = s.closed([attempt(start=MIDNIGHT + 3600, end=MIDNIGHT + 3610, n=2)],
                  MIDNIGHT + 3610, H)
    assert s2.expected["bob"] == pytest.approx(0.7 * 3600 + 0.3 * 10)
    assert s2.default_expected(3600.0) == s2.expected["bob"]
    # the next month starts from nothing, the decayed usage does not
    december = day_start("2026-12-01") + 10
    assert s2.month_used("bob", december) == 0.0
    back = Summary.from_json(s2.to_json())
    assert back.users["bob"][0] == pytest.approx(s2.users["bob"][0], abs=1e-3)
    assert back.expected["bob"] == pytest.approx(s2.expected["bob"], abs=1e-3)


def test_a_user_long_gone_leaves_the_summary() -> None:
    s = Summary().closed([attempt(start=MIDNIGHT, end=MIDNIGHT + 1)], MIDNIGHT + 1, H)
    later = MIDNIGHT + 60 * H  # 2^-60 of two GPU-seconds
    s = s.closed([attempt("ann", start=later - 10, end=later)], later, H)
    assert set(s.users) == {"ann"} and set(s.expected) == {"ann"}


def test_a_damaged_summary_or_chunk_is_an_error_and_hostile_values_are_dropped() -> None:
    with pytest.raises(StoreError):
        Summary.from_json(b"[]")
    with pytest.raises(StoreError):
        Summary.from_json(encode({"users": {"a": [1, 2, 3]}, "month": "x" * 100}))
    s = Summary.from_json(encode({"users": {"a": [float("nan"), 1, 1], "b": [1e300, 1, 1],
                                            "c": [5.0, 1.0, 60.0]}, "month": "2026-11"}))
    assert set(s.users) == {"c"}
    with pytest.raises(StoreError):
        Chunk.from_json(b"x" * (600 * 1024), "2026-11-26.0")
    with pytest.raises(StoreError):
        Chunk.from_json(encode({"day": "2026-11-27", "totals": {}, "attempts": []}),
                        "2026-11-26.0")
    assert parse_chunk_name("2026-11-26.3") == ("2026-11-26", 3)
    assert parse_chunk_name("../x.1") is None and parse_chunk_name("2026-13-01.0") is None


def test_chunks_round_trip_and_compact_into_totals() -> None:
    now = MIDNIGHT + 7200
    a, b = attempt(n=1), attempt("ann", 1, MIDNIGHT, MIDNIGHT + 60, n=2)
    c0 = Chunk("2026-11-26").added(a.per_day(now), a)
    c1 = Chunk("2026-11-26", 1).added(b.per_day(now), b)
    back = Chunk.from_json(c0.to_json(), c0.name)
    assert back.attempts == (a,) and sorted(back.rows()) == sorted(c0.rows())
    merged = compacted([c0, c1])
    assert merged.attempts == () and merged.index == 0
    assert sorted(merged.rows()) == [("2026-11-25", "bob", "H100", 7200.0),
                                     ("2026-11-26", "ann", "H100", 60.0),
                                     ("2026-11-26", "bob", "H100", 3600.0)]


def test_a_chunk_is_the_same_bytes_as_its_whole_encoding() -> None:
    """The chunk's bytes are built from each attempt's kept text (a close re-encodes only
    the totals): byte for byte what encoding the whole chunk gives, escapes included."""
    now = MIDNIGHT + 7200
    chunk = Chunk("2026-11-26")
    for n, (user, end) in enumerate((("bob", None), ("ann", MIDNIGHT + 60), ("zoë", now))):
        one = attempt(user, n + 1, MIDNIGHT, end, n=n)
        chunk = chunk.added(one.per_day(now), one)
    whole = encode({"day": chunk.day, "totals": {
        d: {u: {m: round(v, 3) for m, v in sorted(models.items())}
            for u, models in sorted(users.items())}
        for d, users in sorted(chunk.totals.items())},
        "attempts": [a.to_json() for a in chunk.attempts]})
    assert chunk.to_json() == whole and chunk.to_json() is chunk.to_json()
    assert Chunk("2026-11-26").to_json() == encode({"day": "2026-11-26", "totals": {},
                                                      "attempts": []})


def test_the_ledger_stays_bounded_at_1000_jobs_a_day_for_a_year() -> None:
    """1,000 attempts a day of 50 users on 2 models, each on 2 hosts: a chunk of detail
    stays under CHUNK_BYTES (so a day is about 10 chunks), a compacted day is a few KB, and a
    year is DETAIL_DAYS days of detail plus 330 compacted days (docs/queue.md)."""
    day = "2026-11-26"
    start = day_start(day)
    chunks, chunk = [], Chunk(day)
    for n in range(1000):
        user = f"user{n % 50:02d}"
        a = Attempt(f"20261126-{n:06d}-abcdef.{user}", user, 4,
                    {"NVIDIA H100 80GB HBM3": 2, "NVIDIA A100-SXM4-80GB": 2},
                    ("gpu-node-0012", "gpu-node-0457"), start + n * 60, start + n * 60 + 3000,
                    "succeeded", f"20261126-{n:06d}-abcdef.{user}", 1, 2)
        grown = chunk.added(a.per_day(start + DAY_S), a)
        if chunk.attempts and len(grown.to_json()) > CHUNK_BYTES:
            chunks.append(chunk)
            grown = Chunk(day, chunk.index + 1).added(a.per_day(start + DAY_S), a)
        chunk = grown
    chunks.append(chunk)
    detail = sum(len(c.to_json()) for c in chunks)
    folded = len(compacted(chunks).to_json())
    year = DETAIL_DAYS * detail + (365 - DETAIL_DAYS) * folded
    assert all(len(c.to_json()) < 512 * 1024 for c in chunks)
    assert len(chunks) <= 12 and folded < 16 * 1024
    assert year < 16 * 1024 * 1024, year
    print(f"\nledger: a day of 1,000 attempts {detail / 1024:.0f} KiB in {len(chunks)} "
          f"chunks, compacted {folded / 1024:.1f} KiB, a year {year / 1024 / 1024:.1f} MiB")
