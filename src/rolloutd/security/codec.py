"""AES-GCM payload codec: every Temporal payload rolloutd writes is encrypted.

A payload is encoded as a new payload whose ``data`` is ``nonce (12 bytes) || AES-256-GCM
ciphertext and tag`` of the original payload's serialized protobuf, and whose metadata is
``encoding: binary/encrypted`` and ``encryption-key-id: <key id>`` (the shape of Temporal's
encryption sample, temporalio/samples-python ``encryption/codec.py``). The key id is also
the ciphertext's associated data, so a payload cannot be passed off under another key id.

Keys rotate: a key ring holds every key still needed to decrypt; the newest (the last one
listed) encrypts. Keys come from ``ROLLOUTD_CODEC_KEYS`` or the file named by
``ROLLOUTD_CODEC_KEY_FILE`` (:func:`load_key_ring`); with neither set the codec is off.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Sequence
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from rolloutd.errors import ConfigError

#: metadata ``encoding`` of an encrypted payload
ENCODING = b"binary/encrypted"
#: metadata key naming the key that encrypted a payload
KEY_ID = "encryption-key-id"
NONCE_BYTES = 12
KEY_BYTES = 32
_KEY_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class CodecKeyError(ConfigError):
    """A payload names a key id the key ring does not hold, or fails authentication."""


def generate_key() -> str:
    """A fresh 256-bit key, URL-safe base64 (what ``rolloutd codec-key`` prints)."""
    return base64.urlsafe_b64encode(AESGCM.generate_key(bit_length=256)).decode()


def parse_keys(text: str, *, source: str) -> list[tuple[str, bytes]]:
    """Parse ``id:key`` entries (comma- or newline-separated; ``#`` starts a comment).

    Args:
        text: the entries, oldest first; each key is 32 bytes in URL-safe or standard base64.
        source: where the text came from, for error messages.

    Returns:
        ``[(key_id, key)]`` in the given order (the last one encrypts).

    Raises:
        ConfigError: an entry without ``:``, a bad key id, a key that is not base64 of
            32 bytes, a key id given twice, or no entry at all.
    """
    keys: list[tuple[str, bytes]] = []
    for raw in re.split(r"[,\n]", text):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        key_id, encoded = key_id.strip(), encoded.strip()
        if not sep or not _KEY_ID_RE.match(key_id):
            raise ConfigError(
                f"{source}: entry {key_id[:20]!r}... is not `id:base64key` with "
                f"an id of letters, digits, '.', '_' or '-'"
            )
        try:
            key = base64.b64decode(
                encoded + "=" * (-len(encoded) % 4), altchars=b"-_", validate=True
            )
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != KEY_BYTES:
            raise ConfigError(
                f"{source}: key {key_id!r} is not base64 of {KEY_BYTES} bytes "
                f"(make one with `rolloutd codec-key`)"
            )
        if any(key_id == k for k, _ in keys):
            raise ConfigError(f"{source}: key id {key_id!r} given twice")
        keys.append((key_id, key))
    if not keys:
        raise ConfigError(f"{source}: no key")
    return keys


def load_key_ring(keys: str | None, key_file: str | Path | None) -> list[tuple[str, bytes]]:
    """The codec's keys from settings (``codec_keys``, then ``codec_key_file``), oldest first.

    Args:
        keys: ``ROLLOUTD_CODEC_KEYS``: ``id:key`` entries, comma-separated.
        key_file: ``ROLLOUTD_CODEC_KEY_FILE``: a file of ``id:key`` lines.

    Returns:
        The keys of both sources, the variable's first; empty when neither is set (codec off).

    Raises:
        ConfigError: the file is missing or unreadable, or an entry is malformed.
    """
    ring: list[tuple[str, bytes]] = []
    if keys:
        ring += parse_keys(keys, source="ROLLOUTD_CODEC_KEYS")
    if key_file:
        path = Path(key_file).expanduser()
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"ROLLOUTD_CODEC_KEY_FILE {path}: {e.strerror or e}") from None
        for key_id, key in parse_keys(text, source=str(path)):
            if any(key_id == k for k, _ in ring):
                raise ConfigError(f"{path}: key id {key_id!r} also in ROLLOUTD_CODEC_KEYS")
            ring.append((key_id, key))
    return ring


class AesGcmCodec(PayloadCodec):
    """Encrypts every payload with the newest key; decrypts with the key its id names.

    Args:
        keys: ``[(key_id, 32-byte key)]``, oldest first; the last one encrypts.

    Raises:
        ConfigError: no key, or a key that is not 32 bytes.
    """

    def __init__(self, keys: Sequence[tuple[str, bytes]]) -> None:
        if not keys:
            raise ConfigError("the payload codec needs at least one key")
        for key_id, key in keys:
            if len(key) != KEY_BYTES:
                raise ConfigError(f"codec key {key_id!r} is not {KEY_BYTES} bytes")
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys}
        self.key_id = keys[-1][0]

    @property
    def key_ids(self) -> list[str]:
        """Every key id the codec decrypts."""
        return list(self._ciphers)

    def encrypt(self, payload: Payload) -> Payload:
        """One payload, encrypted with the newest key (a fresh random nonce each time)."""
        nonce = os.urandom(NONCE_BYTES)
        aad = self.key_id.encode()
        data = nonce + self._ciphers[self.key_id].encrypt(nonce, payload.SerializeToString(), aad)
        return Payload(metadata={"encoding": ENCODING, KEY_ID: aad}, data=data)

    def decrypt(self, payload: Payload) -> Payload:
        """One payload, decrypted; a payload that is not encrypted passes through (a history
        written before the codec was switched on stays readable).

        Raises:
            CodecKeyError: the payload's key id is not in the key ring, or its ciphertext
                fails authentication (wrong key, tampered data).
        """
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        key_id = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise CodecKeyError(
                f"payload encrypted with key {key_id!r}, which the key ring "
                f"({', '.join(self._ciphers)}) does not hold"
            )
        data = payload.data
        try:
            plain = cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], key_id.encode())
        except (InvalidTag, ValueError) as e:  # ValueError: shorter than a nonce
            raise CodecKeyError(
                f"payload with key {key_id!r} failed authentication ({type(e).__name__})"
            ) from None
        return Payload.FromString(plain)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Encrypt each payload (Temporal's :class:`PayloadCodec` interface)."""
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Decrypt each payload (Temporal's :class:`PayloadCodec` interface)."""
        return [self.decrypt(p) for p in payloads]
