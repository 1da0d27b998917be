"""The one Temporal client factory: converter, payload codec, failure converter, TLS, API key.

Every Temporal client rolloutd creates (the fleets' workers, the trainer client, the REST facade,
the CLI, the stack) comes from :func:`connect_temporal`, so the codec is on for all of them or for
none (docs/decisions.md, "One Temporal client factory"). With codec keys configured every payload,
and every failure's message and stack trace (``DefaultFailureConverterWithEncodedAttributes``), is
encrypted before it leaves the process.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from rolloutd.errors import ConfigError
from rolloutd.security.codec import AesGcmCodec, load_key_ring
from rolloutd.settings import CommonSettings, codec_key_file


def payload_codec(settings: CommonSettings) -> AesGcmCodec | None:
    """The payload codec of ``settings`` (``codec_keys``, ``codec_key_file``); with neither set,
    the key ``rolloutd up`` generated on this machine (``{home}/codec_keys``) where it exists,
    as the admin token is found; None: off (``ROLLOUTD_CODEC_KEYS=""`` turns it off).

    Raises:
        ConfigError: a key file that cannot be read, a malformed key.
    """
    key_file = settings.codec_key_file
    if settings.codec_keys is None and key_file is None and codec_key_file().is_file():
        key_file = str(codec_key_file())
    ring = load_key_ring(settings.codec_keys, key_file)
    return AesGcmCodec(ring) if ring else None


def data_converter(settings: CommonSettings | None = None) -> DataConverter:
    """rolloutd's data converter: pydantic payloads, plus, when keys are configured, the
    AES-GCM codec and encoded failure attributes (error messages and stack traces are
    payloads too, so they are encrypted as well).

    Args:
        settings: where the codec keys come from; default: ``ROLLOUTD_*`` variables.

    Raises:
        ConfigError: see :func:`payload_codec`.
    """
    codec = payload_codec(settings or CommonSettings())
    if codec is None:
        return pydantic_data_converter
    return dataclasses.replace(
        pydantic_data_converter,
        payload_codec=codec,
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )


def _read(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror or e}") from None


def tls_config(settings: CommonSettings) -> TLSConfig | bool:
    """The TLS configuration of a Temporal connection; False: plain gRPC.

    TLS is on when ``temporal_tls`` is set, any ``temporal_tls_*`` path is given, or an
    API key is (Temporal Cloud's API keys need TLS). mTLS takes both a certificate and its
    key.

    Raises:
        ConfigError: a certificate without its key (or the reverse); an unreadable file.
    """
    s = settings
    if (s.temporal_tls_cert is None) != (s.temporal_tls_key is None):
        raise ConfigError(
            "ROLLOUTD_TEMPORAL_TLS_CERT and ROLLOUTD_TEMPORAL_TLS_KEY go "
            "together (mTLS needs the certificate and its private key)"
        )
    on = (
        s.temporal_tls
        or s.temporal_api_key
        or s.temporal_tls_ca
        or s.temporal_tls_cert
        or s.temporal_tls_server_name
    )
    if not on:
        return False
    return TLSConfig(
        server_root_ca_cert=_read(s.temporal_tls_ca, "ROLLOUTD_TEMPORAL_TLS_CA"),
        client_cert=_read(s.temporal_tls_cert, "ROLLOUTD_TEMPORAL_TLS_CERT"),
        client_private_key=_read(s.temporal_tls_key, "ROLLOUTD_TEMPORAL_TLS_KEY"),
        domain=s.temporal_tls_server_name,
    )


async def connect_temporal(
    settings: CommonSettings | None = None,
    *,
    address: str | None = None,
    namespace: str | None = None,
    runtime: Runtime | None = None,
) -> Client:
    """Connect to Temporal the way every rolloutd process does.

    Args:
        settings: address, namespace, codec keys, TLS files, API key; default: read from
            ``ROLLOUTD_*`` variables.
        address: overrides ``settings.temporal_address`` (``host:port``).
        namespace: overrides ``settings.temporal_namespace``.
        runtime: the Temporal runtime to run on (its telemetry, e.g. a Prometheus
            exporter); None: the SDK's default runtime.

    Returns:
        A connected client whose data converter is :func:`data_converter`'s.

    Raises:
        ConfigError: bad codec keys or TLS files (before any connection is tried).
        RuntimeError: the connection failed (temporalio's error).
    """
    s = settings or CommonSettings()
    return await Client.connect(
        address or s.temporal_address,
        namespace=namespace or s.temporal_namespace,
        data_converter=data_converter(s),
        tls=tls_config(s),
        api_key=s.temporal_api_key,
        runtime=runtime,
    )
