"""Tenant tokens: a tenant is who its token says.

Each token binds a tenant name, the highest Temporal priority the tenant may ask for (1 is
served first, 5 last: ``max_priority: 2`` allows 2 to 5) and the largest fairness weight
(``max_fairness_weight``, default 1.0: a tenant's share among equal priorities is the
operator's to give, never the tenant's to take). No token may name the tenant ``default``:
that is the tenant of every task that names none, the operator's. Tokens are kept hashed at rest
(SHA-256 of the token: they are 256-bit random strings, so a plain hash cannot be reversed by
guessing; NIST SP 800-63B, 5.1.1.2, requires a slow hash only for memorised secrets). The file
(``ROLLOUTD_TENANT_TOKENS_FILE``, or a Kubernetes Secret mounted as one) is JSON::

    {"tenants": [{"tenant": "team-a", "max_priority": 2, "max_fairness_weight": 1.0,
                  "token_sha256": "9f86d0..."}]}

``rolloutd tenant-token TENANT --max-priority N --max-fairness-weight W`` makes a token and
prints its entry. The REST
facade and the trace viewer resolve each request's bearer token to a :class:`Caller`: the
operator (the REST or admin token, or no token at all on a loopback-only facade), a tenant, or
nobody (401).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rolloutd.errors import ConfigError
from rolloutd.types import DEFAULT_TENANT

#: the largest fairness weight a tenant token allows unless its entry says otherwise
DEFAULT_MAX_FAIRNESS_WEIGHT = 1.0


def hash_token(token: str) -> str:
    """The hex SHA-256 of a token: what the tokens file holds."""
    return hashlib.sha256(token.encode()).hexdigest()


class TenantToken(BaseModel):
    """One entry of the tokens file."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", description="the tenant")
    max_priority: int = Field(
        default=3,
        ge=1,
        le=5,
        description="the highest priority (smallest number) the tenant may ask for",
    )
    max_fairness_weight: float = Field(
        default=DEFAULT_MAX_FAIRNESS_WEIGHT,
        gt=0.0,
        le=1000.0,
        description="the largest fairness weight (TaskRequest.fairness_weight) the tenant may "
        "ask for",
    )
    token_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the token")

    @field_validator("tenant")
    @classmethod
    def _not_the_operators(cls, tenant: str) -> str:
        if tenant == DEFAULT_TENANT:
            raise ValueError(
                f"a tenant token cannot name {DEFAULT_TENANT!r}: that is the tenant of every "
                "task that names none (the operator's); name the tenant"
            )
        return tenant


class TenantTokensFile(BaseModel):
    """The tokens file."""

    model_config = ConfigDict(extra="forbid")

    tenants: list[TenantToken] = Field(default_factory=list)


@dataclass(frozen=True)
class Caller:
    """Who made a request.

    Attributes:
        tenant: the tenant its token names; None for the operator.
        max_priority: the highest priority it may ask for (1 for the operator).
        max_fairness_weight: the largest fairness weight it may ask for (the operator: any
            ``TaskRequest`` allows).
    """

    tenant: str | None = None
    max_priority: int = 1
    max_fairness_weight: float = 1000.0

    @property
    def operator(self) -> bool:
        """Whether the caller holds an operator token (sees and may do everything)."""
        return self.tenant is None

    def may_see(self, tenant: str) -> bool:
        """Whether the caller may see, read, view or cancel what ``tenant`` owns."""
        return self.operator or self.tenant == tenant


OPERATOR = Caller()


class TenantTokens:
    """The tenant tokens, by hash.

    Args:
        entries: the tokens file's entries.

    Raises:
        ConfigError: two entries with one hash.
    """

    def __init__(self, entries: list[TenantToken] | None = None) -> None:
        self.by_hash: dict[str, TenantToken] = {}
        for entry in entries or []:
            if entry.token_sha256 in self.by_hash:
                raise ConfigError(f"tenant tokens: one token for two entries ({entry.tenant})")
            self.by_hash[entry.token_sha256] = entry

    @classmethod
    def load(cls, path: str | Path | None) -> TenantTokens:
        """The tokens of a file (None: no tenant tokens).

        Raises:
            ConfigError: the file cannot be read or is malformed (naming the field).
        """
        if path is None:
            return cls()
        try:
            data = json.loads(Path(path).expanduser().read_text())
            return cls(TenantTokensFile.model_validate(data).tenants)
        except OSError as e:
            raise ConfigError(f"ROLLOUTD_TENANT_TOKENS_FILE {path}: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"ROLLOUTD_TENANT_TOKENS_FILE {path}: not JSON: {e}") from None
        except ValidationError as e:
            raise ConfigError(f"ROLLOUTD_TENANT_TOKENS_FILE {path}: {e}") from None

    def __bool__(self) -> bool:
        return bool(self.by_hash)

    def caller(self, token: str) -> Caller | None:
        """The tenant a token names, or None."""
        entry = self.by_hash.get(hash_token(token))
        if entry is None:
            return None
        return Caller(entry.tenant, entry.max_priority, entry.max_fairness_weight)


def resolve_caller(
    sent: str | None, operator_tokens: list[str | None], tenants: TenantTokens
) -> Caller | None:
    """Who a bearer token names.

    Args:
        sent: the bearer token of the request (None or empty: none).
        operator_tokens: the tokens of the operator (REST token, admin token); with none set
            and no tenant tokens, every request is the operator's (a loopback-only facade).
        tenants: the tenant tokens.

    Returns:
        The caller, or None (unknown token, or none where one is needed: 401).
    """
    operators = [t for t in operator_tokens if t]
    if not operators and not tenants:
        return OPERATOR
    if not sent:
        return None
    if any(hmac.compare_digest(sent.encode(), t.encode()) for t in operators):
        return OPERATOR
    return tenants.caller(sent)


def new_tenant_token(
    tenant: str,
    max_priority: int = 3,
    max_fairness_weight: float = DEFAULT_MAX_FAIRNESS_WEIGHT,
) -> tuple[str, TenantToken]:
    """A new token for ``tenant`` and its entry for the tokens file.

    Raises:
        pydantic.ValidationError: a bad tenant name (``default`` included), priority or
            fairness weight.
    """
    token = "rt_" + secrets.token_urlsafe(32)
    return token, TenantToken(
        tenant=tenant,
        max_priority=max_priority,
        max_fairness_weight=max_fairness_weight,
        token_sha256=hash_token(token),
    )


def add_tenant_token(path: str | Path, entry: TenantToken) -> None:
    """Add ``entry`` to the tokens file at ``path`` (created, mode 0600).

    Raises:
        ConfigError: the file is malformed, or already holds this hash.
    """
    path = Path(path).expanduser()
    current = TenantTokens.load(path) if path.exists() else TenantTokens()
    entries = [*current.by_hash.values(), entry]
    TenantTokens(entries)  # refuses a duplicate hash
    text = TenantTokensFile(tenants=entries).model_dump_json(indent=2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
