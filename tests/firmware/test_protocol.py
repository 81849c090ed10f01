"""The shared protocol module: the same vectors on CPython and inside the MicroPython unix port."""

from __future__ import annotations

import binascii
import hashlib
import hmac
import json
import os
from pathlib import Path

import pytest

from holdover.firmware import protocol
from support import run_micropython_json

KEY = "sentinel-key-0123456789"
SID = "garage"

# RFC 4231 test cases 1, 2, 3 and 6 (6: a key longer than the block, hashed first).
RFC4231 = [
    ("0b" * 20, b"Hi There".hex(), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (
        b"Jefe".hex(),
        b"what do ya want for nothing?".hex(),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
    ),
    ("aa" * 20, "dd" * 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
    (
        "aa" * 131,
        b"Test Using Larger Than Block-Size Key - Hash Key First".hex(),
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
    ),
]


def _body(**over: object) -> dict:
    b = protocol.body(SID, "1a2b3c4d", 7, 12345, 1796000000, protocol.MAINS_LOST, {"debounce_ms": 300})
    b.update(over)
    return b


def _raw_envelope(body_bytes: bytes, key: str = KEY) -> bytes:
    sig = protocol.Signer(key).sign(body_bytes)
    return b'{"sig":"' + sig + b'","body":' + body_bytes + b"}"


def open_cases() -> list[tuple[str, bytes, str | None, tuple]]:
    """(name, payload, topic sid, expected) with expected ("ok", kind, seq) or ("rejected", reason)."""
    good = protocol.seal(protocol.Signer(KEY), _body())
    flipped = bytearray(good)
    flipped[good.index(b'"seq":7') + 6] = ord("8")  # seq 7 -> 8 after signing
    upper = good.replace(good[8:72], good[8:72].upper())
    return [
        ("genuine", good, SID, ("ok", "mains_lost", 7)),
        (
            "wrong key",
            protocol.seal(protocol.Signer("another-key-0123456789"), _body()),
            SID,
            ("rejected", "bad_signature"),
        ),
        ("body altered after signing", bytes(flipped), SID, ("rejected", "bad_signature")),
        ("truncated", good[:-5], SID, ("rejected", "malformed")),
        ("empty", b"", SID, ("rejected", "malformed")),
        ("not JSON", b"\xff\xfe garbage \x00", SID, ("rejected", "malformed")),
        ("unsigned JSON", json.dumps(_body()).encode(), SID, ("rejected", "unsigned")),
        ("uppercase signature hex", upper, SID, ("rejected", "malformed")),
        (
            "oversized",
            b'{"sig":"' + b"0" * 64 + b'","body":{"x":"' + b"a" * 3000 + b'"}}',
            SID,
            ("rejected", "oversized"),
        ),
        ("sid differs from topic", good, "kitchen", ("rejected", "schema")),
        (
            "missing seq",
            _raw_envelope(json.dumps({k: v for k, v in _body().items() if k != "seq"}).encode()),
            SID,
            ("rejected", "schema"),
        ),
        ("seq is a bool", _raw_envelope(json.dumps(_body(seq=True)).encode()), SID, ("rejected", "schema")),
        ("seq zero", _raw_envelope(json.dumps(_body(seq=0)).encode()), SID, ("rejected", "schema")),
        ("future version", _raw_envelope(json.dumps(_body(v=2)).encode()), SID, ("rejected", "schema")),
        ("unknown kind", _raw_envelope(json.dumps(_body(kind="teleport")).encode()), SID, ("rejected", "schema")),
        ("data not an object", _raw_envelope(json.dumps(_body(data=[1])).encode()), SID, ("rejected", "schema")),
        ("signed body not JSON", _raw_envelope(b"{not json"), SID, ("rejected", "malformed")),
        ("ts a float", _raw_envelope(json.dumps(_body(ts=1.5)).encode()), SID, ("rejected", "schema")),
    ]


def _cpython_open(payload: bytes, sid: str | None) -> list:
    try:
        body = protocol.open_envelope(payload, protocol.Signer(KEY), sid)
        return ["ok", body["kind"], body["seq"]]
    except protocol.ProtocolError as e:
        return ["rejected", e.reason]


@pytest.fixture(scope="module")
def mpy_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    vec = {
        "key": KEY,
        "hmac": [{"key": k, "msg": m} for k, m, _ in RFC4231],
        "open": [{"payload": p.hex(), "sid": s} for _, p, s, _ in open_cases()],
        "to_seal": [_body(), _body(kind="boot", seq=1, data={"note": "ünïcode", "v": 3.55, "n": None})],
    }
    return run_micropython_json("protocol_vectors.py", vec, tmp_path_factory.mktemp("vec"))  # type: ignore[return-value]


@pytest.mark.parametrize("i", range(len(RFC4231)))
def test_hmac_matches_rfc4231_on_both_interpreters(i: int, mpy_results: dict) -> None:
    key, msg, want = RFC4231[i]
    got = protocol.Signer(binascii.unhexlify(key)).digest(binascii.unhexlify(msg)).hex()
    assert got == want
    assert mpy_results["hmac"][i] == want


def test_hmac_matches_stdlib_on_random_inputs() -> None:
    for n in (0, 1, 63, 64, 65, 200):
        key, msg = os.urandom(n or 1), os.urandom(n * 7)
        assert protocol.Signer(key).digest(msg) == hmac.new(key, msg, hashlib.sha256).digest()


@pytest.mark.parametrize("case", open_cases(), ids=[c[0] for c in open_cases()])
def test_open_envelope_same_verdict_on_both_interpreters(case: tuple, mpy_results: dict) -> None:
    name, payload, sid, expected = case
    i = [c[0] for c in open_cases()].index(name)
    assert tuple(_cpython_open(payload, sid)) == expected
    assert tuple(mpy_results["open"][i]) == expected


def test_envelopes_sealed_by_micropython_verify_on_cpython(mpy_results: dict) -> None:
    first, second = (s.encode() for s in mpy_results["sealed"])
    assert protocol.open_envelope(first, protocol.Signer(KEY), SID) == _body()
    body = protocol.open_envelope(second, protocol.Signer(KEY), SID)
    assert body["data"] == {"note": "ünïcode", "v": 3.55, "n": None}
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.open_envelope(first, protocol.Signer("not-the-key-0123456"), SID)
    assert e.value.reason == protocol.BAD_SIGNATURE


def test_seal_refuses_an_oversized_body() -> None:
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.seal(protocol.Signer(KEY), _body(data={"x": "a" * protocol.MAX_PAYLOAD}))
    assert e.value.reason == protocol.OVERSIZED


def test_topics_round_trip_and_refuse_strangers() -> None:
    for leaf in protocol.LEAVES:
        assert protocol.parse_topic(protocol.topic(SID, leaf)) == (SID, leaf)
    for bad in (
        "holdover/x",
        "other/garage/event",
        "holdover/ga rage/event",
        "holdover/garage/nope",
        "holdover//event",
    ):
        assert protocol.parse_topic(bad) is None


def test_protocol_doc_names_every_kind_and_reason() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    for name in (*protocol.KINDS, protocol.BAD_SIGNATURE, protocol.REPLAYED, protocol.OVERSIZED, protocol.UNSIGNED):
        assert f"`{name}`" in doc, name
