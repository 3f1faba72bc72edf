"""The uid range of --run-as-range and the pool that hands its uids to live attempts."""

from __future__ import annotations

import pytest

from gpulayer.worker.identities import NoFreeUidError, UidPool, UidRange


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("10", "FIRST-LAST"),
        ("20-10", "FIRST-LAST"),
        ("a-b", "FIRST-LAST"),
        ("-5-10", "FIRST-LAST"),
        ("0-10", "uid 0 is root"),
        ("100-4294967295", "past the largest uid"),
    ],
)
def test_bad_ranges_name_the_flag(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as caught:
        UidRange.parse(text)
    assert str(caught.value).startswith("--run-as-range: ")


def test_a_range_holds_its_ends() -> None:
    uids = UidRange.parse(" 61000-61002 ")
    assert (uids.first, uids.last, len(uids)) == (61000, 61002, 3)
    assert 61000 in uids and 61002 in uids and 60999 not in uids and 61003 not in uids


def test_the_pool_gives_each_live_attempt_its_own_uid_and_the_lowest_free_one() -> None:
    # Uids no test runs anything as: a release ends the processes of its uid.
    first = 1_900_000_000
    pool = UidPool(UidRange(first, first + 2))
    taken = [pool.take() for _ in range(3)]
    assert taken == [first, first + 1, first + 2] and pool.held == 3
    with pytest.raises(NoFreeUidError, match="all 3 uids are held"):
        pool.take()
    pool.release(first + 1)
    assert pool.take() == first + 1
    pool.release(first)
    pool.release(first)  # twice is harmless
    assert pool.held == 2 and pool.take() == first
