"""The trace viewer's pages, server-rendered HTML: the list of tasks, a task with its group of
sessions, and a session with its completions and traces (docs/viewer.md).

Pure functions of rolloutd's types: the routes (:mod:`rolloutd.viewer.routes`) read the task's
status, the session's completion log and its trajectory, and pass them here. Every number a
reader may check carries a ``data-k`` attribute naming it (``reward``, ``num_completions``,
...) so tests and scripts read the page without guessing its layout.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from rolloutd.types import Completion, SessionResult, TaskProgress, Trace, Trajectory
from rolloutd.viewer.runs import FAILURE_KINDS, TASK_STATES, TaskFilter, TaskListing
from rolloutd.viewer.tokens import TOKEN_CSS, TokenText, prompt_html, response_html

PAGE_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#111;max-width:1400px}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:18px 0 6px}h3{font-size:14px}
table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ccc;padding:2px 6px;
 text-align:left;font-size:12px}th{background:#f0f0f0}
.st-completed{color:#070}.st-failed{color:#b00}.st-timeout,.st-cancelled{color:#a60}
.msg{border-left:3px solid #99a;padding:2px 8px;margin:4px 0;white-space:pre-wrap;
 font:12px/1.4 ui-monospace,monospace}
.msg .role{font-weight:bold;color:#335}
.toolcall{border-left-color:#c80;background:#fff6e6}.toolresult{border-left-color:#08a;
 background:#eef8fb}
.legend span{padding:0 4px;margin-right:6px;font-size:12px}
#hover{position:sticky;top:0;background:#ffd;border:1px solid #cc9;padding:2px 6px;
 font:12px ui-monospace,monospace;min-height:1.4em}
"""

#: the page's only script: a hover handler per token container, reading the trace's arrays
HOVER_JS = """
var traces = {};
document.addEventListener('mouseover', function (e) {
  var t = e.target, box = t.parentNode;
  if (t.tagName !== 'SPAN' || !box || !box.dataset || !box.dataset.trace) return;
  var n = box.dataset.trace, data = traces[n];
  if (!data) data = traces[n] = JSON.parse(document.getElementById('data-' + n).textContent);
  var i = Array.prototype.indexOf.call(box.getElementsByTagName('span'), t);
  var part = box.dataset.part, line = part + ' token ' + i + ' id ' + data[part + '_ids'][i];
  if (part === 'response') {
    line += ' loss_mask ' + data.loss_mask[i] + ' logprob ' + data.response_logprobs[i];
  }
  document.getElementById('hover').textContent = line;
});
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _num(key: str, value: Any, fmt: str = "") -> str:
    """A number the page states, marked ``data-k=key`` (``none`` when missing)."""
    shown = "none" if value is None else format(value, fmt)
    return f'<span data-k="{key}">{_e(shown)}</span>'


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{PAGE_CSS}{TOKEN_CSS}</style></head>"
        f"<body>{body}<script>{HOVER_JS}</script></body></html>"
    )


def session_href(session_id: str) -> str:
    """The viewer path of a session (its id keeps its slashes)."""
    return "/view/session/" + quote(session_id, safe="/")


def task_href(task_id: str) -> str:
    """The viewer path of a task."""
    return "/view/task/" + quote(task_id, safe="")


def _status(status: str) -> str:
    return f'<span class="st-{_e(status)}" data-k="status">{_e(status)}</span>'


def task_page(progress: TaskProgress) -> str:
    """A task and its group: one row per ended session (status, failure, reward, completions,
    traces, trainable tokens, a link to its page), the replaced ones under it.

    Args:
        progress: the task as it stands (:meth:`RolloutClient.status`).
    """
    result = progress.result
    mean = result.mean_reward if result is not None else None
    head = (
        f"<h1>task {_e(progress.task_id)}</h1><p>status {_status(progress.status)} · "
        f"sessions ended {_num('num_ended', len(progress.sessions))} of "
        f"{_num('num_samples', progress.num_samples)} · mean reward "
        f"{_num('mean_reward', mean, _reward_format(mean))}"
        + (f" · error {_e(progress.error)}" if progress.error else "")
        + "</p>"
    )
    body = head + _sessions_table(progress.sessions, "sessions")
    if progress.replaced:
        body += "<h2>replaced sessions</h2>" + _sessions_table(progress.replaced, "replaced")
    if progress.status == "running":
        body += "<p>running: reload for sessions that end meanwhile</p>"
    return _page(f"task {progress.task_id}", body)


def tasks_href(**filters: object) -> str:
    """The viewer path of the task list with ``filters`` (:class:`~rolloutd.viewer.runs.
    TaskFilter`'s fields; None left out)."""
    query = urlencode({k: v for k, v in filters.items() if v is not None})
    return "/view/tasks" + (f"?{query}" if query else "")


def tasks_page(listing: TaskListing, where: TaskFilter, *, tenant_fixed: bool = False) -> str:
    """The list of runs: a filter form (tenant, status, failure kind, mean reward, start
    time) and one row per task (its id linking to its page, status, tenant, harness, mean
    reward, its failed sessions by kind, each linking to the session's page, start and end).

    Args:
        listing: the tasks (:func:`rolloutd.viewer.runs.list_runs`).
        where: the filters the page was asked for (the form shows them).
        tenant_fixed: the caller is a tenant: the tenant field is shown, not editable.
    """

    def value(name: str) -> str:
        v = getattr(where, name)
        if isinstance(v, datetime):
            return v.strftime("%Y-%m-%dT%H:%M")
        return "" if v is None else _e(v)

    def select(name: str, choices: Sequence[str]) -> str:
        options = "".join(
            f'<option value="{_e(c)}"{" selected" if getattr(where, name) == c else ""}>'
            f"{_e(c) or 'any'}</option>"
            for c in ("", *choices)
        )
        return f'<label>{name} <select name="{name}">{options}</select></label> '

    tenant = (
        f'<label>tenant <input name="tenant" value="{value("tenant")}" size="12"'
        + (" readonly" if tenant_fixed else "")
        + "></label> "
    )
    form = (
        '<form id="filters" method="get" action="/view/tasks">'
        + tenant
        + select("status", sorted(TASK_STATES))
        + select("failure", FAILURE_KINDS)
        + f'<label>reward ≥ <input name="min_reward" value="{value("min_reward")}" size="5">'
        f'</label> <label>≤ <input name="max_reward" value="{value("max_reward")}" size="5">'
        f'</label> <label>started from <input type="datetime-local" name="since" '
        f'value="{value("since")}"></label> <label>to <input type="datetime-local" '
        f'name="until" value="{value("until")}"></label> (UTC) '
        f'<input type="hidden" name="limit" value="{where.limit}">'
        '<button type="submit">filter</button> <a href="/view/tasks">clear</a></form>'
    )
    rows = [
        "<tr><th>task</th><th>status</th><th>tenant</th><th>harness</th><th>mean reward</th>"
        "<th>failed sessions</th><th>started (UTC)</th><th>ended (UTC)</th></tr>"
    ]
    for row in listing.rows:
        failed = ", ".join(
            f'<a href="{session_href(sid)}" data-failure="{_e(kind)}">{_e(kind)} {_e(sid)}</a>'
            for sid, kind in row.failed_sessions
        )
        rows.append(
            f'<tr data-task="{_e(row.task_id)}">'
            f'<td><a href="{task_href(row.task_id)}">{_e(row.task_id)}</a></td>'
            f"<td>{_status(row.status)}</td><td>{_e(row.tenant)}</td>"
            f"<td>{_e(row.harness)}</td>"
            f"<td>{_num('mean_reward', row.mean_reward, _reward_format(row.mean_reward))}</td>"
            f"<td>{failed}</td><td>{_when(row.started_at)}</td><td>{_when(row.closed_at)}</td>"
            "</tr>"
        )
    noun = "task" if len(listing.rows) == 1 else "tasks"
    note = f"<p>{_num('num_tasks', len(listing.rows))} {noun}, newest first"
    if len(listing.rows) == where.limit:
        note += f" (the first {where.limit}: narrow the filters for older ones)"
    if listing.truncated:
        note += " · the failure filter looked at its first sessions only"
    note += "</p>"
    body = f'<h1>tasks</h1>{form}{note}<table id="tasks">{"".join(rows)}</table>'
    return _page("tasks", body)


def _reward_format(reward: float | None) -> str:
    return "" if reward is None else ".4g"


def _when(moment: datetime | None) -> str:
    return "" if moment is None else _e(moment.strftime("%Y-%m-%d %H:%M:%S"))


def _sessions_table(sessions: Sequence[SessionResult], table_id: str) -> str:
    rows = [
        "<tr><th>sample</th><th>session</th><th>status</th><th>failure</th><th>reward</th>"
        "<th>completions</th><th>call errors</th><th>traces</th><th>trainable tokens</th>"
        "<th>time s</th></tr>"
    ]
    for s in sorted(sessions, key=lambda s: (s.sample_index, s.session_id)):
        total = sum(p.duration_s for p in s.phases)
        rows.append(
            f'<tr data-session="{_e(s.session_id)}"><td>{s.sample_index}</td>'
            f'<td><a href="{session_href(s.session_id)}">{_e(s.session_id)}</a></td>'
            f"<td>{_status(s.status.value)}</td>"
            f"<td>{_e(s.failure.kind) if s.failure else ''}</td>"
            f"<td>{_num('reward', s.reward)}</td>"
            f"<td>{_num('num_completions', s.num_completions)}</td>"
            f"<td>{_num('num_call_errors', s.num_call_errors)}</td>"
            f"<td>{_num('num_traces', s.num_traces)}</td>"
            f"<td>{_num('num_trainable_tokens', s.num_trainable_tokens)}</td>"
            f"<td>{total:.2f}</td></tr>"
        )
    return f'<table id="{table_id}">{"".join(rows)}</table>'


def session_page(
    session: SessionResult,
    completions: Sequence[Completion],
    trajectory: Trajectory | None,
    tokens: TokenText,
) -> str:
    """A session: its outcome and phases, its completions, and each trace's tokens.

    Args:
        session: the session's result.
        completions: its completion log, in order.
        trajectory: its trajectory (None when none was built).
        tokens: decodes the traces' token ids (the model's tokenizer).
    """
    failure = session.failure
    head = (
        f"<h1>session {_e(session.session_id)}</h1>"
        f'<p>task <a href="{task_href(session.task_id)}">{_e(session.task_id)}</a> · '
        f"sample {session.sample_index} · status {_status(session.status.value)} · reward "
        f"{_num('reward', session.reward)} · completions "
        f"{_num('num_completions', session.num_completions)} · traces "
        f"{_num('num_traces', session.num_traces)} · trainable tokens "
        f"{_num('num_trainable_tokens', session.num_trainable_tokens)} · call errors "
        f"{_num('num_call_errors', session.num_call_errors)}</p>"
    )
    if failure is not None:
        head += (
            f"<p>failure <b>{_e(failure.kind)}</b> in {_e(failure.phase)}: "
            f"{_e(failure.message)}</p>"
        )
    elif session.error:
        head += f"<p>error: {_e(session.error)}</p>"
    phases = "".join(
        f"<tr><td>{_e(p.phase)}</td><td>{p.duration_s:.3f}</td></tr>" for p in session.phases
    )
    body = head + (
        f'<h2>phases</h2><table id="phases"><tr><th>phase</th><th>s</th></tr>{phases}</table>'
    )
    body += "<h2>completions</h2>" + _completions_table(completions)
    body += '<div id="hover">hover a token for its id, loss_mask and logprob</div>'
    if trajectory is None:
        body += "<p>no trajectory was built for this session</p>"
    else:
        stats = trajectory.stats
        body += (
            f"<h2>trajectory</h2><p>builder {_e(trajectory.builder)} · chains "
            f"{stats.num_chains} · chain breaks {stats.num_chain_breaks} · drift tokens "
            f"{_num('num_drift_tokens', stats.num_drift_tokens)} · response tokens "
            f"{stats.num_response_tokens}</p>" + _LEGEND
        )
        for trace in trajectory.traces:
            body += _trace_section(trace, tokens)
    return _page(f"session {session.session_id}", body)


_LEGEND = (
    '<p class="legend">trainable (loss_mask 1), by logprob: <span class="k0">&gt; -0.1'
    '</span><span class="k1">&gt; -0.5</span><span class="k2">&gt; -1</span>'
    '<span class="k3">&gt; -2</span><span class="k4">≤ -2</span> · '
    '<span class="n">not trainable</span><span class="k0 d">drift</span>'
    '<span class="k0 r">recomputed logprob</span><b class="cb">#i</b> completion i '
    "starts</p>"
)


def _completions_table(completions: Sequence[Completion]) -> str:
    rows = [
        "<tr><th>#</th><th>dialect</th><th>capture</th><th>backend</th><th>policy</th>"
        "<th>prompt</th><th>sampled</th><th>finish</th><th>started (unix s)</th>"
        "<th>first token s</th><th>duration s</th><th>extends</th><th>error</th></tr>"
    ]
    for c in completions:
        t = c.timings
        rows.append(
            f'<tr data-completion="{c.index}"><td>{c.index}</td><td data-k="dialect">'
            f"{_e(c.dialect)}</td><td>{_e(c.capture_mode.value)}</td>"
            f'<td data-k="backend">{_e(c.backend)}</td>'
            f"<td>{_num('policy_version', c.policy_version)}</td>"
            f"<td>{_num('num_prompt_tokens', len(c.prompt_ids))}</td>"
            f"<td>{_num('num_response_tokens', len(c.response_ids))}</td>"
            f'<td data-k="finish_reason">{_e(c.finish_reason)}</td>'
            f"<td>{t.started_at:.3f}</td>"
            f"<td>{'' if t.first_token_s is None else f'{t.first_token_s:.3f}'}</td>"
            f"<td>{_num('duration_s', t.duration_s, '.3f')}</td>"
            f"<td>{'' if c.extends is None else c.extends}</td><td>{_e(c.error)}</td></tr>"
        )
    return f'<table id="completions">{"".join(rows)}</table>'


def _message_html(message: dict[str, Any]) -> str:
    """One chat message; tool calls and tool results shown as such."""
    role = str(message.get("role", "?"))
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep their text
        content = "\n".join(
            str(p.get("text", p)) if isinstance(p, dict) else str(p) for p in content
        )
    if role == "tool":
        name = message.get("name") or message.get("tool_call_id") or ""
        return (
            f'<div class="msg toolresult"><span class="role">tool result</span> '
            f"{_e(name)}\n{_e(content)}</div>"
        )
    out = f'<div class="msg"><span class="role">{_e(role)}</span>\n{_e(content or "")}</div>'
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        out += (
            f'<div class="msg toolcall"><span class="role">tool call</span> '
            f"{_e(fn.get('name'))}({_e(fn.get('arguments'))})</div>"
        )
    return out


def _trace_section(trace: Trace, tokens: TokenText) -> str:
    n = trace.trace_index
    prompt_texts = tokens.texts(trace.prompt_ids)
    response_texts = tokens.texts(trace.response_ids)
    offsets = list(zip(trace.response_offsets, trace.completion_indices, strict=False))
    data = {
        "prompt_ids": trace.prompt_ids,
        "response_ids": trace.response_ids,
        "loss_mask": trace.loss_mask,
        "response_logprobs": trace.response_logprobs,
    }
    messages = "".join(_message_html(m) for m in [*trace.prompt_messages, *trace.response_messages])
    num_trainable = sum(trace.loss_mask)
    return (
        f'<section class="trace" data-trace-index="{n}"><h2>trace {n}</h2>'
        f"<p>reward {_num('reward', trace.reward)} · finish {_e(trace.finish_reason)} · "
        f"prompt tokens {_num('num_prompt_tokens', len(trace.prompt_ids))} · response "
        f"tokens {_num('num_response_tokens', len(trace.response_ids))} · trainable "
        f"{_num('num_trainable_tokens', num_trainable)} · drift positions "
        f"{_num('num_drift_positions', len(trace.drift_positions))} · completions "
        f"{_e(trace.completion_indices)} · policy versions {_e(trace.policy_versions)}</p>"
        f"<details><summary>messages ({len(trace.prompt_messages)} prompt, "
        f"{len(trace.response_messages)} response)</summary>{messages}</details>"
        f'<h3>prompt</h3><div class="toks prompt" data-trace="{n}" data-part="prompt">'
        f"{prompt_html(prompt_texts)}</div>"
        f'<h3>response</h3><div class="toks" data-trace="{n}" data-part="response">'
        + response_html(
            response_texts,
            trace.response_ids,
            trace.loss_mask,
            trace.response_logprobs,
            drift_positions=trace.drift_positions,
            recomputed_positions=trace.recomputed_logprob_positions,
            completion_offsets=offsets,
            special_ids=tokens.special_ids,
        )
        + f'</div><script type="application/json" id="data-{n}">'
        + json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
        + "</script></section>"
    )
