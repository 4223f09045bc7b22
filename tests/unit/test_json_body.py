"""The API's body parser gives what ``json.loads`` gives, objects and errors alike."""

from __future__ import annotations

import json

import pytest

from service.api.json_body import parse_json

SAME_OBJECTS = [
    b'{"images": [{"data": "' + b"A" * 5000 + b'"}], "top_k": 3}',
    b"18446744073709551616",  # past 64 bits: an int still (a float would fail strict validation differently)
    b"-9223372036854775809",
    b"1e400",  # infinity, refused later by allow_inf_nan=False with the same error
    b"1.7976931348623157e309",
    b"-0.0",
    b"0.1",
    b'{"a": 1, "a": 2}',  # the last of duplicate keys
    b'"\\ud83d\\ude00"',  # a surrogate pair: one character
    b'"\\u0000"',
    b' {"x": [1, 2.5, true, null]} ',
]
# jiter refuses these; the standard parser reads them as before, so validation sees the same objects.
READ_BY_THE_STANDARD_PARSER = [
    b'"\\ud800"',  # a lone surrogate: the API answers 400 for it, not 422
    b"NaN",
    b"[Infinity]",
    b"\xef\xbb\xbf{}",
    '"\u00e9"'.encode("utf-16"),
]
REFUSED = [b"[1,]", b'{"a": 1}x', b'"\x01"', b"[" * 5000 + b"]" * 5000, b'"\xff"', b""]


@pytest.mark.parametrize("body", SAME_OBJECTS + READ_BY_THE_STANDARD_PARSER)
def test_parsed_as_json_loads_parses(body: bytes) -> None:
    expected, parsed = json.loads(body), parse_json(body)
    assert repr(parsed) == repr(expected)
    assert type(parsed) is type(expected)


@pytest.mark.parametrize("body", REFUSED)
def test_refused_with_the_standard_error(body: bytes) -> None:
    with pytest.raises(Exception) as expected:
        json.loads(body)
    with pytest.raises(type(expected.value)) as got:
        parse_json(body)
    assert str(got.value) == str(expected.value)
