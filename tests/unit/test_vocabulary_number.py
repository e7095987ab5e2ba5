"""protocol.vocabulary.number: the one reading of a number typed as text (queue-cli's flags, the
HTTP API's query and path values)."""
import math

from hypothesis import given, strategies as st

from queue_server.protocol.vocabulary import number


def test_an_integer_stays_an_integer() -> None:
    assert number("42") == 42 and type(number("42")) is int
    assert number("-7") == -7
    assert number(" 3 ") == 3  # as int() reads it


def test_a_decimal_is_a_float() -> None:
    assert number("1.5") == 1.5
    assert number("1e3") == 1000.0 and type(number("1e3")) is float


def test_what_is_no_finite_number_is_none() -> None:
    for text in ("", "abc", "1.2.3", "nan", "inf", "-inf", "Infinity", "1e999"):
        assert number(text) is None, text


@given(st.integers())
def test_every_integer_reads_back(value: int) -> None:
    assert number(str(value)) == value


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_reads_back(value: float) -> None:
    got = number(repr(value))
    assert got is not None and math.isclose(got, value) or got == value
