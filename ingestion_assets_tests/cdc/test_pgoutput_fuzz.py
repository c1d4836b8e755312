"""The decoder and the transaction assembler against generated, mutated and random bytes: a message or a
ProtocolError (a CdcError for the assembler), never another exception."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ingestion_assets.sources.postgres.cdc import CdcError, Decoder, ProtocolError, decode, format_lsn, parse_lsn
from ingestion_assets.sources.postgres.cdc.assembler import TransactionAssembler
from ingestion_assets.sources.postgres.cdc.messages import Message, StreamAbort
from ingestion_assets_tests.cdc.encode import encode, messages

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = b"BCORYIUDTMSEcAbPKrp"


def decodes_or_refuses(payload: bytes, in_stream: bool) -> Message | None:
    try:
        return decode(payload, in_stream)
    except ProtocolError as exc:
        assert "pgoutput message" in str(exc) or "empty" in str(exc)
        return None


@FUZZ
@given(st.data(), st.booleans())
def test_every_message_round_trips(data: st.DataObject, in_stream: bool) -> None:
    message = data.draw(messages(in_stream))
    assert decode(encode(message), in_stream) == message


@FUZZ
@given(st.data(), st.booleans())
def test_truncated_messages_are_refused_naming_type_and_offset(data: st.DataObject, in_stream: bool) -> None:
    message = data.draw(messages(in_stream))
    payload = encode(message)
    cut = data.draw(st.integers(0, len(payload) - 1))
    assume(not (isinstance(message, StreamAbort) and cut == 9))  # a v4 abort cut after its v2 fields is a v2 abort
    with pytest.raises(ProtocolError, match=r"(pgoutput message '.'.* at offset \d+ of \d+ bytes)|empty"):
        decode(payload[:cut], in_stream)


@FUZZ
@given(st.data(), st.booleans())
def test_mutated_messages_decode_or_are_refused(data: st.DataObject, in_stream: bool) -> None:
    payload = bytearray(encode(data.draw(messages(in_stream))))
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(0, len(payload)))
        action = data.draw(st.sampled_from(["flip", "insert", "delete", "swap_stream"]))
        if action == "flip" and where < len(payload):
            payload[where] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "insert":
            payload[where:where] = data.draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del payload[where : where + data.draw(st.integers(1, 8))]
        else:
            in_stream = not in_stream
    decodes_or_refuses(bytes(payload), in_stream)


@FUZZ
@given(st.sampled_from(list(KINDS)) | st.integers(0, 255), st.binary(max_size=64), st.booleans())
def test_random_bytes_decode_or_are_refused(kind: int, body: bytes, in_stream: bool) -> None:
    decodes_or_refuses(bytes([kind]) + body, in_stream)


@FUZZ
@given(st.lists(st.one_of(messages(False), messages(True)), max_size=30))
def test_message_sequences_assemble_or_are_refused(sequence: list[Message]) -> None:
    """Out-of-order or inconsistent streams (a change before its relation, a commit without a begin, ...)."""
    assembler = TransactionAssembler()
    try:
        for message in sequence:
            assembler.feed(message)
    except CdcError:
        return
    assert all(tx.end_lsn >= 0 for tx in assembler.completed)


STREAM_PAYLOADS = st.tuples(st.sampled_from([b"S", b"E", b"I", b"R", b"A"]), st.binary(max_size=40))


@FUZZ
@given(st.lists(STREAM_PAYLOADS.map(lambda parts: parts[0] + parts[1]), max_size=20))
def test_the_stream_tracking_decoder_refuses_only_with_protocol_errors(payloads: list[bytes]) -> None:
    decoder = Decoder()
    for payload in payloads:
        try:
            decoder.decode(payload)
        except ProtocolError:
            continue


@given(st.integers(0, 2**64 - 1))
def test_lsn_text_round_trips(value: int) -> None:
    assert parse_lsn(format_lsn(value)) == value


@pytest.mark.parametrize("text", ["", "0", "1/", "/1", "G/1", "1/2/3", "123456789/0"])
def test_malformed_lsn_text_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a PostgreSQL LSN"):
        parse_lsn(text)
