"""Whose fault a failure is (rolloutd.fault): the one rule the gateway's backends, a
session's failed calls, its liveness and the callback activity all read."""

from __future__ import annotations

import httpx
import pytest

from rolloutd.errors import (
    BackendError,
    BackendSaturatedError,
    BackendUnavailableError,
    ConfigError,
    ContextLengthError,
    InvalidRequestError,
    RequestTooLargeError,
    SessionClosedError,
    SessionLostError,
    TooManyCallsError,
)
from rolloutd.fault import (
    Fault,
    call_fault,
    exception_fault,
    receiver_status_fault,
    status_fault,
    transport_fault,
)

INFRA, TASK = Fault.INFRASTRUCTURE, Fault.TASK


@pytest.mark.parametrize(
    ("status", "fault"), [(400, TASK), (404, TASK), (413, TASK), (429, TASK), (500, INFRA)]
)
def test_an_answer_status_is_the_servers_fault_only_when_5xx(status, fault):
    assert status_fault(status) is fault
    assert status_fault(status).retryable is (fault is INFRA)


@pytest.mark.parametrize(
    ("status", "fault"),
    [(400, TASK), (403, TASK), (408, INFRA), (409, INFRA), (425, INFRA), (429, INFRA)]
    + [(413, TASK), (502, INFRA), (503, INFRA)],
)
def test_a_busy_receiver_is_tried_again(status, fault):
    assert receiver_status_fault(status) is fault


def test_no_answer_at_all_is_the_infrastructures():
    request = httpx.Request("POST", "http://127.0.0.1:9/x")
    for error in (
        httpx.ConnectError("refused", request=request),
        httpx.ReadTimeout("slow", request=request),
        httpx.RemoteProtocolError("dropped", request=request),
    ):
        assert transport_fault(error) is INFRA


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        (BackendError("x", retryable=False), INFRA),  # a backend's 4xx is still the backend's
        (BackendUnavailableError("x"), INFRA),
        (RuntimeError("a bug"), INFRA),  # the harness gets a 500
        (ContextLengthError("too long"), TASK),
        (InvalidRequestError("bad body"), TASK),
        (RequestTooLargeError("413"), TASK),
        (SessionClosedError("sealed"), TASK),
        (BackendSaturatedError("a concurrency bound"), TASK),
        (TooManyCallsError("a session's bound of calls in flight"), TASK),
        # a 4xx the gateway makes for its own reasons is the infrastructure's
        (ConfigError("backend b cannot serve capture_mode 'passthrough'"), INFRA),
        (SessionLostError("session t/0 is lost"), INFRA),
    ],
)
def test_a_failed_model_call_as_raised_and_as_recorded(error, fault):
    assert exception_fault(error) is fault
    status = getattr(error, "status_code", 500)
    assert call_fault(type(error).__name__, status) is fault
