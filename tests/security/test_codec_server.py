"""``rolloutd codec-server``: Temporal's remote codec protocol, token and CORS."""

from __future__ import annotations

import base64

import httpx
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload

from rolloutd.security.codec import AesGcmCodec, generate_key, parse_keys
from rolloutd.security.codec_server import create_codec_app

TOKEN = "codec-token-123"
UI = "http://127.0.0.1:8233"


def client() -> tuple[httpx.AsyncClient, AesGcmCodec]:
    codec = AesGcmCodec(parse_keys(f"k1:{generate_key()}", source="t"))
    app = create_codec_app(codec, TOKEN, origins=[UI])
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://codec.test"
    ), codec


def as_json(p: Payload) -> dict:
    return json_format.MessageToDict(p)


async def test_decode_and_encode_round_trip_in_the_protocols_json() -> None:
    http, codec = client()
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'{"instruction": "hi"}')
    (encrypted,) = await codec.encode([plain])
    async with http:
        # the UI's form: the token as the endpoint's first path segment
        r = await http.post(
            f"/{TOKEN}/decode",
            json={"payloads": [as_json(encrypted)]},
            headers={"X-Namespace": "default", "Origin": UI},
        )
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == UI
        (decoded,) = r.json()["payloads"]
        assert base64.b64decode(decoded["data"]) == b'{"instruction": "hi"}'
        # the CLI's form: --codec-auth "Bearer <token>"
        r = await http.post(
            "/encode",
            json={"payloads": [as_json(plain)]},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        (again,) = r.json()["payloads"]
        assert base64.b64decode(again["metadata"]["encoding"]) == b"binary/encrypted"
        assert await codec.decode([json_format.ParseDict(again, Payload())]) == [plain]


async def test_no_token_wrong_token_and_foreign_origins_are_refused() -> None:
    http, codec = client()
    (encrypted,) = await codec.encode([Payload(data=b"x")])
    body = {"payloads": [as_json(encrypted)]}
    async with http:
        assert (await http.post("/decode", json=body)).status_code == 401
        assert (await http.post("/wrong/decode", json=body)).status_code == 401
        assert (
            await http.post("/decode", json=body, headers={"Authorization": "Bearer wrong"})
        ).status_code == 401
        preflight = await http.options(
            f"/{TOKEN}/decode",
            headers={
                "Origin": UI,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,x-namespace",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == UI
        foreign = await http.options(
            f"/{TOKEN}/decode",
            headers={"Origin": "http://evil.test", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in foreign.headers
        bad = await http.post(f"/{TOKEN}/decode", json={"payloads": [{"nonsense": 1}]})
        assert bad.status_code == 400
        health = (await http.get("/health")).json()
        assert health == {"status": "ok", "key_ids": ["k1"], "encrypts_with": "k1"}
