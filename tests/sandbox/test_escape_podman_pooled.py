"""The podman escape tests (tests/sandbox/test_escape_podman.py) on pooled runtimes: each
container is a warm pool's hit, started before its session asked and handed the session's
files and env at claim (tests/sandbox/conftest.py's ``pooled_make_runtime``). Not here: the
Dockerfile-built image test, since a spec with ``build`` is never pooled.

``acceptance``: containers and the session-wide stack, as the module it imports.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from rolloutd.sandbox.runtimes import Runtime
from tests.sandbox.test_escape_podman import (  # noqa: F401 - collected here on pooled runtimes
    pytestmark,
    rest_facade,
    test_another_runtimes_session_is_not_reachable,
    test_host_files_and_environment_are_invisible,
    test_nothing_but_the_sessions_gateway_answers,
    test_root_inside_cannot_mount_or_end_the_exec_server,
    test_writes_do_not_reach_the_host,
)


@pytest.fixture
def make_runtime(pooled_make_runtime: Callable[..., Awaitable[Runtime]]):  # noqa: ANN201
    """Each runtime a warm pool's hit."""
    return pooled_make_runtime
