"""Tokens against a real SQLite store: kinds, scrypt for chosen ones, expiry, caps, revocation."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from gpulayer.cli.durations import parse_duration
from gpulayer.control.auth import TokenAuthority, issue_token, keep_chosen_token
from gpulayer.control.store import Store
from gpulayer.control.tokens import new_token
from gpulayer.errors import UsageError


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'state.db'}")


def test_generated_tokens_are_found_by_their_fast_hash(store: Store) -> None:
    token, record = issue_token(store, "join", "pool a", max_workers=3)
    authority = TokenAuthority(store)
    principal = authority(token)
    assert principal is not None and principal.kind == "join" and principal.token_id == record.id
    assert authority(token + "x") is None
    assert store.get_token(record.id).hash == hashlib.sha256(token.encode()).hexdigest()


def test_a_chosen_token_is_kept_as_salted_scrypt_and_never_as_its_sha256(
    store: Store, tmp_path: Path
) -> None:
    chosen = "correct horse battery staple"
    keep_chosen_token(store, chosen, "admin", "initial")
    other = Store(f"sqlite:///{tmp_path / 'other.db'}")
    keep_chosen_token(other, chosen, "admin", "initial")
    first, second = store.list_tokens()[0], other.list_tokens()[0]
    assert first.scheme == "scrypt" and first.salt != second.salt
    assert first.digest != second.digest  # salted: the same token gives another digest
    store.close()
    raw = b"".join(f.read_bytes() for f in tmp_path.glob("state.db*"))
    assert hashlib.sha256(chosen.encode()).hexdigest().encode() not in raw
    assert chosen.encode() not in raw
    reopened = Store(f"sqlite:///{tmp_path / 'state.db'}")
    authority = TokenAuthority(reopened)
    assert authority(chosen) is not None and authority(chosen).kind == "admin"  # type: ignore[union-attr]
    assert authority("correct horse battery stapler") is None


def test_an_old_unsalted_admin_token_is_rehashed_on_first_use(store: Store) -> None:
    chosen = "an-admin-token-someone-typed"
    store.add_token(hashlib.sha256(chosen.encode()).hexdigest(), "admin", "initial")
    authority = TokenAuthority(store)
    assert authority(chosen) is not None
    row = store.list_tokens()[0]
    assert row.scheme == "scrypt" and row.hash == f"scrypt:{row.id}"
    assert TokenAuthority(store)(chosen) is not None  # a fresh process finds it by scrypt


def test_revoked_and_expired_tokens_are_refused_on_the_next_call(store: Store) -> None:
    authority = TokenAuthority(store)
    join, join_record = issue_token(store, "join")
    credential, _ = issue_token(store, "worker", worker_id="w-1", parent_id=join_record.id)
    assert authority(join) is not None and authority(credential) is not None
    assert store.revoke_token(join_record.id) == 2  # the join token and the worker it made
    assert authority(join) is None
    assert authority(credential) is None
    expired, _ = issue_token(store, "join", expires_at=time.time() - 1)
    assert authority(expired) is None
    removed, removed_record = issue_token(store, "admin")
    assert authority(removed) is not None
    store.remove_token(removed_record.hash)  # gone from the store: gone for this process too
    assert authority(removed) is None


def test_a_join_token_registers_no_more_workers_than_its_cap(store: Store) -> None:
    _, record = issue_token(store, "join", max_workers=2)
    assert store.count_registration(record.id)
    assert store.count_registration(record.id)
    assert not store.count_registration(record.id)
    assert store.get_token(record.id).registered == 2


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("1.5h", 5400)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--expires") == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5m", "0", "5y", "1e3"])
def test_bad_durations_name_the_flag(text: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse_duration(text, "--expires")
    assert str(raised.value).startswith("--expires: ")


def test_wrong_tokens_never_reach_scrypt_once_the_chosen_token_is_known(store: Store) -> None:
    chosen = "correct horse battery staple"
    keep_chosen_token(store, chosen, "admin", "initial")
    authority = TokenAuthority(store)
    authority.trust(chosen)  # what the server does at start with GPULAYER_TOKEN
    assert authority.slow_checks == 1
    for client in range(8):
        for i in range(40):
            assert authority(f"guess-{client}-{i}", f"10.0.0.{client}") is None
            assert authority(new_token(), f"10.0.0.{client}") is None
    assert authority(chosen[:-1], "10.0.0.9") is None
    assert authority.slow_checks == 1  # judged by lookups alone
    principal = authority(chosen, "10.0.0.9")
    assert principal is not None and principal.kind == "admin"
    assert authority.slow_checks == 1


def test_an_unverified_chosen_token_costs_few_scrypts_per_client_a_minute(store: Store) -> None:
    chosen = "correct horse battery staple"
    keep_chosen_token(store, chosen, "admin", "initial")
    now = [0.0]
    authority = TokenAuthority(store, slow_checks_per_minute=3, clock=lambda: now[0])
    for i in range(20):
        assert authority(f"guess-{i}", "10.0.0.1") is None
    assert authority.slow_checks == 3
    assert authority(new_token(), "10.0.0.1") is None  # generated tokens: never scrypt
    assert authority.slow_checks == 3
    assert authority("another guess", "10.0.0.2") is None  # another client has its own budget
    assert authority.slow_checks == 4
    assert authority(chosen, "10.0.0.1") is None  # out of budget, even the right one
    now[0] = 61.0
    assert authority(chosen, "10.0.0.1") is not None
    assert authority.slow_checks == 5
    assert authority("yet another", "10.0.0.1") is None
    assert authority.slow_checks == 5  # every chosen token is known now


def test_a_flood_of_wrong_guesses_from_one_client_leaves_the_right_one_from_another(
    store: Store,
) -> None:
    chosen = "correct horse battery staple"
    keep_chosen_token(store, chosen, "admin", "initial")
    authority = TokenAuthority(store, slow_checks_per_minute=3)
    for i in range(50):
        assert authority(f"guess-{i}", "10.0.0.1") is None
    assert authority.slow_checks == 3
    principal = authority(chosen, "10.0.0.2")
    assert principal is not None and principal.kind == "admin"
    assert authority.slow_checks == 4


def test_a_token_left_unchecked_for_want_of_allowance_is_not_remembered_as_wrong(
    store: Store,
) -> None:
    chosen = "correct horse battery staple"
    keep_chosen_token(store, chosen, "admin", "initial")
    authority = TokenAuthority(store, slow_checks_per_minute=1, fresh_seconds=60)
    assert authority("a guess", "10.0.0.1") is None
    assert authority(chosen, "10.0.0.1") is None  # this client's allowance is spent: unchecked
    principal = authority(chosen, "10.0.0.2")  # so another client's try is checked, not cached
    assert principal is not None and principal.kind == "admin"


def test_a_revocation_by_another_process_is_seen_within_a_second(
    store: Store, tmp_path: Path
) -> None:
    now = [0.0]
    authority = TokenAuthority(store, clock=lambda: now[0])
    token, record = issue_token(store, "admin")
    assert authority(token) is not None
    Store(store.url).revoke_token(record.id)  # another server on the same database
    now[0] = 0.5
    assert authority(token) is not None  # remembered for at most fresh_seconds
    now[0] = 1.0
    assert authority(token) is None
