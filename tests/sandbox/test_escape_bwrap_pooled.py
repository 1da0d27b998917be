"""The bwrap escape tests (tests/sandbox/test_escape_bwrap.py) on pooled sandboxes: each is a
warm pool's hit, started before its session asked and handed the session's files and env at
claim (tests/sandbox/conftest.py's ``pooled_make_runtime``).

``acceptance``: a second run of the default tier's bwrap escape tests, on pooled sandboxes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from rolloutd.sandbox.runtimes import Runtime
from tests.sandbox.test_escape_bwrap import pytestmark as bwrap_marks
from tests.sandbox.test_escape_bwrap import (  # noqa: F401 - collected here on pooled runtimes
    test_commands_are_not_root,
    test_default_network_is_gateway_and_only_the_session_is_reachable,
    test_fork_bomb_is_bounded_and_torn_down,
    test_host_environment_is_not_visible,
    test_non_loopback_addresses_are_unreachable,
    test_other_loopback_ports_of_the_host_are_unreachable,
    test_unbound_files_are_invisible,
    test_writes_outside_the_workspace_fail,
)

pytestmark = [*bwrap_marks, pytest.mark.acceptance]


@pytest.fixture
def make_runtime(pooled_make_runtime: Callable[..., Awaitable[Runtime]]):  # noqa: ANN201
    """Each runtime a warm pool's hit."""
    return pooled_make_runtime
