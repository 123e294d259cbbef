"""``serving/proxy/admission.py`` on its own: the counts stay consistent under any sequence of
takes, waits, retries, leaves and give-backs, and each decision is the documented one
(docs/proxy.md, "Fair share between keys"). The HTTP behaviour is in test_proxy_fairness.py."""

from __future__ import annotations

import multiprocessing
import random

import pytest

from serving.proxy.admission import (
    ADMITTED,
    KEY_LIMIT,
    OVER_SHARE,
    QUEUED,
    Admission,
    cells_needed,
)

NAMES = ["a", "b", "c"]


def test_a_key_alone_takes_the_whole_pool_then_429() -> None:
    adm = Admission(4, NAMES)
    assert [adm.take(0) for _ in range(5)] == [ADMITTED] * 4 + [OVER_SHARE]
    assert adm.total == 4 and adm.held(0) == 4


def test_below_share_waits_and_gets_the_freed_slot_first() -> None:
    adm = Admission(4, NAMES)
    for _ in range(4):
        assert adm.take(0) == ADMITTED
    assert adm.take(1) == QUEUED  # b: 0 held, share 4 // 2 = 2
    assert adm.take(1) == QUEUED
    assert adm.take(1) == OVER_SHARE  # b would wait for more than its share
    assert adm.waiting == 2
    adm.give_back(0)
    assert adm.take(0) == OVER_SHARE  # a is above its share while b waits: no slot for a
    assert adm.retry(1) == ADMITTED
    assert adm.retry(1) == QUEUED  # the pool is full again
    adm.give_back(0)
    assert adm.retry(1) == ADMITTED
    assert (adm.held(0), adm.held(1), adm.waiting) == (2, 2, 0)
    adm.give_back(1)
    assert adm.take(0) == ADMITTED  # nobody waits: a may use the free slot (work-conserving)


def test_a_key_limit_holds_with_free_slots() -> None:
    adm = Admission(8, NAMES, {"c": 2})
    assert [adm.take(2) for _ in range(3)] == [ADMITTED, ADMITTED, KEY_LIMIT]
    assert adm.take(0) == ADMITTED


def test_a_waiter_leaving_takes_its_count_with_it() -> None:
    adm = Admission(2, NAMES)
    adm.take(0), adm.take(0)
    assert adm.take(1) == QUEUED
    adm.leave(1)
    assert adm.waiting == 0
    adm.give_back(0)
    assert adm.take(0) == ADMITTED  # nobody waits any more


@pytest.mark.parametrize("seed", range(20))
def test_the_counts_stay_consistent_under_any_sequence(seed: int) -> None:
    rng = random.Random(seed)
    pool = rng.randint(1, 9)
    limits = {"c": rng.randint(1, pool)}
    adm = Admission(pool, NAMES, limits)
    held = [0, 0, 0]
    waiting = [0, 0, 0]
    for _ in range(400):
        i = rng.randrange(3)
        op = rng.choice(["take", "take", "retry", "leave", "give_back"])
        if op == "take":
            others_wait = adm.waiting > 0
            share = adm.share(i)
            decided = adm.take(i)
            if decided == ADMITTED:
                held[i] += 1
                assert not others_wait or held[i] <= share  # below its share, or nobody waits
            elif decided == QUEUED:
                waiting[i] += 1
                assert held[i] < share
            elif decided == KEY_LIMIT:
                assert held[i] >= adm.limits[i] and adm.limits[i] < pool
        elif op == "retry" and waiting[i]:
            decided = adm.retry(i)
            if decided != QUEUED:
                waiting[i] -= 1
            if decided == ADMITTED:
                held[i] += 1
        elif op == "leave" and waiting[i]:
            adm.leave(i)
            waiting[i] -= 1
        elif op == "give_back" and held[i]:
            adm.give_back(i)
            held[i] -= 1
        assert [adm.held(k) for k in range(3)] == held
        assert adm.total == sum(held) <= pool
        assert adm.waiting == sum(waiting) <= pool
        assert held[2] <= limits["c"]
        active = sum(1 for k in range(3) if held[k] or waiting[k])
        assert adm._cells[2] == active  # the active-keys count behind share()


def test_shared_memory_counts_are_one_for_every_process() -> None:
    """With --workers the cells are a RawArray under one lock (what workers.py builds)."""
    ctx = multiprocessing.get_context("spawn")
    cells = ctx.RawArray("q", cells_needed(len(NAMES)))
    lock = ctx.Lock()
    first, second = Admission(2, NAMES, None, cells, lock), Admission(2, NAMES, None, cells, lock)
    assert first.take(0) == ADMITTED and second.take(0) == ADMITTED
    assert second.take(1) == QUEUED and first.waiting == 1
    first.give_back(0)
    assert second.retry(1) == ADMITTED and first.held(1) == 1
