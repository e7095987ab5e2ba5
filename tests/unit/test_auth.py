"""Client authentication's pure parts (server/auth.py): the token check (any of the file's
tokens passes), the per-address limit on failures with a fake clock, the UDP auth_token,
reading the token file (one token per line)."""
from __future__ import annotations

import pytest

from queue_server.server.auth import AUTH_FAILED, AUTH_THROTTLED, Authenticator, read_token_file


def test_off_lets_everything_through_and_strips_auth_token():
    auth = Authenticator(None)
    assert not auth.required and auth.valid("anything")
    value = {"action": 1, "auth_token": "x"}
    assert auth.datagram(value) and "auth_token" not in value


def test_token_check():
    auth = Authenticator([b"s3cret"])
    assert auth.valid("s3cret") and auth.valid(b"s3cret")
    for wrong in ("s3cre", "s3cret ", "", None, 123, ["s3cret"]):
        assert not auth.valid(wrong)


def test_any_of_several_tokens_passes():
    auth = Authenticator([b"old-token", b"new-token"])
    assert auth.valid("old-token") and auth.valid("new-token")
    for wrong in ("old-tokennew-token", "old-token\nnew-token", "new", ""):
        assert not auth.valid(wrong)
    good = {"action": 2, "queue": "q", "auth_token": "new-token"}
    assert auth.datagram(good) and good == {"action": 2, "queue": "q"}
    assert auth.attempt("10.0.0.1", "old-token", 1.0) is None


def test_failures_are_limited_per_address_and_forgotten_after_the_window():
    auth = Authenticator([b"t"], max_failures=3, window=10.0)
    for i in range(3):
        assert auth.attempt("10.0.0.1", "wrong", 100.0 + i) == AUTH_FAILED
    # the right token is refused unchecked while the address is over its limit...
    assert auth.attempt("10.0.0.1", "t", 105.0) == AUTH_THROTTLED
    # ...other addresses are not affected...
    assert auth.attempt("10.0.0.2", "t", 105.0) is None
    # ...and once the window has passed the address may try again
    assert auth.attempt("10.0.0.1", "t", 112.5) is None
    assert (auth.failed_total, auth.throttled_total) == (3, 1)


def test_datagrams_need_a_valid_auth_token():
    auth = Authenticator([b"t"])
    good = {"action": 2, "queue": "q", "auth_token": "t"}
    assert auth.datagram(good) and good == {"action": 2, "queue": "q"}
    assert not auth.datagram({"action": 2, "queue": "q"})
    assert not auth.datagram({"action": 2, "queue": "q", "auth_token": "no"})
    assert not auth.datagram({"action": 2, "token": "t"})  # `token` is the lease token
    assert not auth.datagram(["not", "an", "object"])
    assert auth.failed_total == 4


def test_token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("  abc\n")
    assert read_token_file(str(path)) == (b"abc",)
    path.write_text("# rotation: the new token first\nnew token \n\n  old\n# old\nnew token\n")
    assert read_token_file(str(path)) == (b"new token", b"old")
    path.write_text("\n# nothing but a comment\n")
    with pytest.raises(ValueError, match="holds no token"):
        read_token_file(str(path))
    with pytest.raises(ValueError, match="cannot read"):
        read_token_file(str(tmp_path / "missing"))
