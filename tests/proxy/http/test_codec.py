import json

import pytest

from calroute.proxy.http import codec


@pytest.mark.parametrize(
    "value",
    [
        {"prompt": 'héllo \u2028 "quoted"', "max_tokens": 16, "stream": True, "temperature": 0.0},
        {
            "messages": [{"role": "user", "content": "x" * 10_000}],
            "stop": None,
            "logit_bias": {"50256": -100},
        },
        {"seed": 2**70},  # beyond orjson: the standard library writes it
        [1, -2, 3.5, True, False, None, "", {}],
    ],
)
def test_dumps_writes_what_the_standard_library_reads_back(value: object) -> None:
    data = codec.dumps(value)
    assert isinstance(data, bytes)
    assert json.loads(data) == value


def test_dumps_is_compact() -> None:
    assert codec.dumps({"a": 1, "b": [1, 2]}) == b'{"a":1,"b":[1,2]}'
    assert codec.dumps({"seed": 2**70}) == b'{"seed":%d}' % 2**70


@pytest.mark.parametrize(
    "data",
    [b"{not json", b"\xff\xfe{}", b'{"a": NaN}', b'{"a": Infinity}', b"", b'{"a": 1} trailing'],
)
def test_what_is_not_json_is_a_decode_error(data: bytes) -> None:
    with pytest.raises(codec.DecodeError):
        codec.loads(data)


def test_loads_reads_bytes_and_text_alike() -> None:
    assert codec.loads(b'{"a": [1, 2.5, "\\u00e9"]}') == codec.loads('{"a": [1, 2.5, "\\u00e9"]}')
    assert codec.loads(b'{"a": [1, 2.5, "\\u00e9"]}') == {"a": [1, 2.5, "é"]}
