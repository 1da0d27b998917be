"""The AES-GCM payload codec, its key ring, and the client factory's converter."""

from __future__ import annotations

import base64
import os

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.converter import DefaultFailureConverterWithEncodedAttributes

from rolloutd.errors import ConfigError
from rolloutd.security.codec import (
    ENCODING,
    KEY_ID,
    AesGcmCodec,
    CodecKeyError,
    generate_key,
    load_key_ring,
    parse_keys,
)
from rolloutd.security.connection import data_converter, tls_config
from rolloutd.settings import CommonSettings

SECRET = b'{"session_key": "k-secret-123", "instruction": "a prompt in clear"}'


def payload(data: bytes = SECRET) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=data)


async def test_encode_hides_the_data_and_names_the_newest_key() -> None:
    ring = parse_keys(f"old:{generate_key()},new:{generate_key()}", source="test")
    codec = AesGcmCodec(ring)
    (encoded,) = await codec.encode([payload()])
    assert encoded.metadata["encoding"] == ENCODING
    assert encoded.metadata[KEY_ID] == b"new"
    assert b"k-secret-123" not in encoded.SerializeToString()
    assert b"prompt" not in encoded.SerializeToString()
    (decoded,) = await codec.decode([encoded])
    assert decoded == payload()
    # a fresh nonce each time: equal payloads do not give equal ciphertexts
    (again,) = await codec.encode([payload()])
    assert again.data != encoded.data


async def test_old_keys_decrypt_after_rotation_and_unknown_keys_are_refused() -> None:
    old_key, new_key = generate_key(), generate_key()
    before = AesGcmCodec(parse_keys(f"k1:{old_key}", source="t"))
    (written,) = await before.encode([payload()])
    rotated = AesGcmCodec(parse_keys(f"k1:{old_key}\nk2:{new_key}", source="t"))
    assert rotated.key_id == "k2"
    assert await rotated.decode([written]) == [payload()]
    dropped = AesGcmCodec(parse_keys(f"k2:{new_key}", source="t"))
    with pytest.raises(CodecKeyError, match="'k1'"):
        await dropped.decode([written])


async def test_tampering_and_a_relabelled_key_id_fail_authentication() -> None:
    key = generate_key()
    codec = AesGcmCodec(parse_keys(f"a:{key},b:{key}", source="t"))
    (encoded,) = await codec.encode([payload()])
    tampered = Payload(
        metadata=dict(encoded.metadata), data=encoded.data[:-1] + bytes([encoded.data[-1] ^ 1])
    )
    with pytest.raises(CodecKeyError, match="authentication"):
        await codec.decode([tampered])
    # the key id is the associated data: the same key under another id does not open it
    relabelled = Payload(metadata={**encoded.metadata, KEY_ID: b"a"}, data=encoded.data)
    with pytest.raises(CodecKeyError, match="authentication"):
        await codec.decode([relabelled])


async def test_payloads_written_before_the_codec_pass_through() -> None:
    codec = AesGcmCodec([("k", os.urandom(32))])
    assert await codec.decode([payload()]) == [payload()]


def test_bad_keys_are_refused_with_their_source(tmp_path) -> None:
    with pytest.raises(ConfigError, match="ROLLOUTD_CODEC_KEYS: key 'k' is not base64 of 32"):
        load_key_ring("k:" + base64.b64encode(b"short").decode(), None)
    with pytest.raises(ConfigError, match="not `id:base64key`"):
        load_key_ring("no-colon", None)
    with pytest.raises(ConfigError, match="given twice"):
        load_key_ring(f"k:{generate_key()},k:{generate_key()}", None)
    with pytest.raises(ConfigError, match="ROLLOUTD_CODEC_KEY_FILE"):
        load_key_ring(None, tmp_path / "missing")
    keys = tmp_path / "keys"
    keys.write_text(f"# rotated 2026-11\nk1:{generate_key()}\n\nk2:{generate_key()}  # now\n")
    assert [k for k, _ in load_key_ring(f"k0:{generate_key()}", keys)] == ["k0", "k1", "k2"]
    assert load_key_ring(None, None) == []


def test_the_converter_encrypts_only_when_keys_are_set(tmp_path) -> None:
    off = data_converter(CommonSettings(codec_keys=None, codec_key_file=None))
    assert off.payload_codec is None
    keys = tmp_path / "keys"
    keys.write_text(f"k1:{generate_key()}\n")
    on = data_converter(CommonSettings(codec_keys=None, codec_key_file=str(keys)))
    assert isinstance(on.payload_codec, AesGcmCodec)
    assert on.failure_converter_class is DefaultFailureConverterWithEncodedAttributes


def test_tls_settings(tmp_path) -> None:
    assert tls_config(CommonSettings()) is False
    cert, key, ca = (tmp_path / n for n in ("c.pem", "k.pem", "ca.pem"))
    for f in (cert, key, ca):
        f.write_bytes(f"-- {f.name} --".encode())
    tls = tls_config(
        CommonSettings(
            temporal_tls_cert=str(cert),
            temporal_tls_key=str(key),
            temporal_tls_ca=str(ca),
            temporal_tls_server_name="t",
        )
    )
    assert not isinstance(tls, bool)
    assert (tls.client_cert, tls.client_private_key, tls.server_root_ca_cert, tls.domain) == (
        b"-- c.pem --",
        b"-- k.pem --",
        b"-- ca.pem --",
        "t",
    )
    assert tls_config(CommonSettings(temporal_api_key="x")) is not False
    with pytest.raises(ConfigError, match="go together"):
        tls_config(CommonSettings(temporal_tls_cert=str(cert)))
    with pytest.raises(ConfigError, match="TLS_CA"):
        tls_config(CommonSettings(temporal_tls_ca=str(tmp_path / "nope")))
