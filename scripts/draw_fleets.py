"""Draw docs/fleets.svg: the four fleets, their task queues, and one session's path.

Every name in the picture is read from the code, so the picture changes when the code does:

- the fleets and their queues: ``rolloutd.task_queues.FLEET_QUEUES``;
- what each fleet's workers run (workflows, activities, and on which queue): the ``Worker(...)``
  calls of each fleet's builder in ``src/rolloutd/workers/fleets.py`` (read with ``ast``);
- one session's activities, in the order ``RolloutSessionWorkflow`` runs them
  (:data:`SESSION_PATH`): each must be an ``execute_activity`` call of
  ``src/rolloutd/workflows/session/workflow.py`` or ``ending.py`` and be registered by a fleet,
  and every activity those modules call must be in the path, else the script fails;
- the runtimes, harnesses and backends: the ``Literal`` types of ``RuntimeSpec.type``,
  ``HarnessSpec.type`` and ``GatewaySettings.backend_type``; the dialects: the ``DIALECT`` of
  each module of ``proxy/dialects``; the training side: the modules of
  ``trainer_client/training``; the trainer bridges: the modules of ``trainer_client/bridges``.

Usage::

    python scripts/draw_fleets.py            # writes docs/fleets.svg
    python scripts/draw_fleets.py --check    # exit 1 when docs/fleets.svg is stale

tests/test_fleets_picture.py (default tier) runs the check.
"""

from __future__ import annotations

import argparse
import ast
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "rolloutd"
OUT = ROOT / "docs" / "fleets.svg"
sys.path.insert(0, str(ROOT / "src"))

from rolloutd import task_queues  # noqa: E402
from rolloutd.activities import names as activity_names  # noqa: E402
from rolloutd.settings import GatewaySettings  # noqa: E402
from rolloutd.task_spec import HarnessSpec, RuntimeSpec  # noqa: E402

#: the activities of one session, in the order RolloutSessionWorkflow runs them
#: (docs/architecture.md, "One session, step by step"); teardown_runtime runs always
SESSION_PATH = (
    "read_task_request",  # a large request, stored once by its task: read back first
    "open_session",
    "provision_runtime",
    "run_harness",
    "collect_artifacts",
    "teardown_runtime",
    "close_session",
    "build_trajectory",
    "evaluate",
)
SESSION_MODULES = ("workflows/session/workflow.py", "workflows/session/ending.py")
#: how the bridges' trainers are spelt (module name -> trainer)
TRAINERS = {
    "trl": "TRL",
    "trl_async": "TRL",
    "trl_sync": "TRL",
    "verl": "verl",
    "skyrl": "SkyRL",
}
DIALECTS = {
    "openai_chat": "OpenAI Chat",
    "openai_responses": "OpenAI Responses",
    "anthropic": "Anthropic Messages",
    "gemini": "Gemini",
}
COLOURS = {"workflows": "#4f6bd8", "sandbox": "#d9822b", "gateway": "#2e9e6e", "eval": "#a24fb0"}
TINTS = {"workflows": "#eef1fc", "sandbox": "#fcf2e8", "gateway": "#e9f6f0", "eval": "#f5ebf7"}
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
SANS = "DejaVu Sans, Helvetica, Arial, sans-serif"


@dataclass
class Fleet:
    """What one fleet's workers run: ``queue -> names``, in the builder's order."""

    name: str
    queues: dict[str, list[str]] = field(default_factory=dict)


def _literal(annotation: object) -> list[str]:
    return [a for a in typing.get_args(annotation) if isinstance(a, str)]


def _queue_name(node: ast.expr, fleet: str) -> str:
    """``task_queues.SANDBOX`` -> its value; ``acts.host_queue`` -> the fleet's host queue."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "task_queues":
            return getattr(task_queues, node.attr)
        if node.attr == "host_queue":
            return task_queues.host_queue(fleet, "{host}")  # type: ignore[arg-type]
    raise SystemExit(f"draw_fleets: cannot read the task queue {ast.unparse(node)!r} of {fleet}")


def _callable_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    raise SystemExit(f"draw_fleets: cannot name {ast.unparse(node)!r}")


def read_fleets() -> dict[str, Fleet]:
    """Each fleet's queues and what its workers register there (workers/fleets.py)."""
    tree = ast.parse((SRC / "workers" / "fleets.py").read_text())
    builders: dict[str, str] = {}
    functions: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
            functions[node.name] = node
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "_BUILDERS":
            assert isinstance(node.value, ast.Dict)
            for key, value in zip(node.value.keys, node.value.values):
                builders[ast.literal_eval(key)] = _callable_name(value)
    if list(builders) != list(task_queues.FLEET_QUEUES):
        raise SystemExit(f"draw_fleets: builders {list(builders)} != fleets of task_queues")
    fleets = {}
    for name, function in builders.items():
        fleet = Fleet(name)
        for call in ast.walk(functions[function]):
            if not (isinstance(call, ast.Call) and _callable_name(call.func) == "Worker"):
                continue
            kw = {k.arg: k.value for k in call.keywords}
            queue = _queue_name(kw["task_queue"], name)
            names = fleet.queues.setdefault(queue, [])
            for key in ("workflows", "activities"):
                if isinstance(kw.get(key), ast.List):
                    names += [_callable_name(e) for e in kw[key].elts]  # type: ignore[union-attr]
        fleets[name] = fleet
    return fleets


def _activity_name(node: ast.expr) -> str:
    """An activity call's first argument: a name of :mod:`rolloutd.activities.names`."""
    if isinstance(node, ast.Name) and node.id in activity_names.__all__:
        return getattr(activity_names, node.id)
    raise SystemExit(f"draw_fleets: {ast.unparse(node)!r} is not an activity name")


def read_session_activities() -> list[tuple[str, str]]:
    """``(activity, task-queue expression)`` of every ``execute_activity`` call of a session."""
    calls = []
    for module in SESSION_MODULES:
        for node in ast.walk(ast.parse((SRC / module).read_text())):
            if isinstance(node, ast.Call) and _callable_name(node.func) == "execute_activity":
                kw = {k.arg: k.value for k in node.keywords}
                calls.append((_activity_name(node.args[0]), ast.unparse(kw["task_queue"])))
    return calls


def session_steps(fleets: dict[str, Fleet]) -> list[tuple[str, str, str]]:
    """``(activity, fleet, queue)`` per step of :data:`SESSION_PATH`, checked against the code.

    An activity sent to a host queue (``runtime.host_queue``, ``opened.host_queue``) is shown
    on the host queue of the fleet that registers it there; one sent to a fleet queue on it.
    """
    called = read_session_activities()
    names = {name for name, _ in called}
    if names != set(SESSION_PATH):
        raise SystemExit(
            f"draw_fleets: the session calls {sorted(names)}, SESSION_PATH holds "
            f"{sorted(SESSION_PATH)}: update SESSION_PATH (in the order they run)"
        )
    steps = []
    for activity in SESSION_PATH:
        expression = next(q for name, q in called if name == activity)
        for fleet in fleets.values():
            for queue, registered in fleet.queues.items():
                on_host = "@" in queue
                if activity in registered and on_host == expression.endswith("host_queue"):
                    steps.append((activity, fleet.name, queue))
                    break
            else:
                continue
            break
        else:
            raise SystemExit(f"draw_fleets: no fleet registers {activity} on {expression}")
    return steps


def read_parts() -> dict[str, list[str]]:
    """Runtimes, harnesses, backends, dialects and trainers, from the code."""
    dialects = []
    for path in sorted((SRC / "proxy" / "dialects").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "DIALECT"
            ):
                dialects.append(ast.literal_eval(node.value))
    order = list(DIALECTS)
    dialects.sort(key=lambda d: order.index(d) if d in order else len(order))
    trainers: list[str] = []
    modules = sorted((SRC / "trainer_client" / "bridges").glob("*.py"))
    modules.sort(key=lambda p: list(TRAINERS).index(p.stem) if p.stem in TRAINERS else 99)
    for path in modules:
        if path.stem not in ("__init__", "common"):
            trainer = TRAINERS.get(path.stem, path.stem)
            if trainer not in trainers:
                trainers.append(trainer)
    return {
        "runtimes": _literal(RuntimeSpec.model_fields["type"].annotation),
        "harnesses": _literal(HarnessSpec.model_fields["type"].annotation),
        "backends": _literal(GatewaySettings.model_fields["backend_type"].annotation),
        "dialects": [DIALECTS.get(d, d) for d in dialects],
        "trainers": trainers,
        "training": sorted(
            p.stem
            for p in (SRC / "trainer_client" / "training").glob("*.py")
            if p.stem != "__init__"
        ),
    }


class Svg:
    """A few SVG primitives, written in order."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.items: list[str] = []

    def rect(self, x, y, w, h, *, fill="#ffffff", stroke="#9aa0a6", rx=6, width=1.0) -> None:
        self.items.append(
            f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rx}" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{width:g}"/>'
        )

    def text(self, x, y, s, *, size=12, mono=False, bold=False, fill="#202124", anchor="start"):
        weight = ' font-weight="bold"' if bold else ""
        family = MONO if mono else SANS
        self.items.append(
            f'<text x="{x:g}" y="{y:g}" font-family="{family}" font-size="{size:g}"{weight} '
            f'fill="{fill}" text-anchor="{anchor}">{escape(s)}</text>'
        )

    def arrow(self, x1, y1, x2, y2, *, colour="#5f6368", dashed=False) -> None:
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.items.append(
            f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{colour}" '
            f'stroke-width="1.6"{dash} marker-end="url(#head)"/>'
        )

    def render(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
            f'height="{self.height}" viewBox="0 0 {self.width} {self.height}">\n'
            "<!-- written by scripts/draw_fleets.py from the code; do not edit by hand -->\n"
            '<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
            'fill="#5f6368"/></marker></defs>\n'
            f'<rect width="{self.width}" height="{self.height}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.items) + "\n</svg>\n"


def _wrap(words: list[str], width: int, sep: str = " · ") -> list[str]:
    """Join ``words`` with ``sep`` into lines of at most ``width`` characters."""
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + len(sep) + len(word) <= width:
            lines[-1] += sep + word
        else:
            lines.append(word)
    return lines


def draw() -> str:
    """The picture, as SVG text."""
    fleets = read_fleets()
    steps = session_steps(fleets)
    parts = read_parts()
    W, M, GAP = 1200, 20, 20
    svg = Svg(W, 790)
    svg.text(M, 30, "rolloutd: the fleets, their task queues, and one session's path", size=18,
             bold=True)  # fmt: skip

    # trainers on top
    top, th = 48, 72
    tw = (W - 2 * M - 2 * GAP) / 3
    boxes = [
        ("client side: rolloutd.trainer_client", ["RolloutClient: submit · result · trajectory",
                                                  "buffers · backend admin · sync client"]),
        ("REST facade: rolloutd rest", ["POLAR /rollout/task/*, ProRL /add_llm_server"]),
        ("training side: trainer_client.training", [" · ".join(parts["training"]),
                                                    "bridges: " + " · ".join(parts["trainers"])]),
    ]  # fmt: skip
    for i, (title, lines) in enumerate(boxes):
        x = M + i * (tw + GAP)
        svg.rect(x, top, tw, th, fill="#f8f9fa")
        svg.text(x + 12, top + 24, title, size=13, bold=True)
        for j, line in enumerate(lines):
            svg.text(x + 12, top + 46 + 16 * j, line, size=11, mono=True)
    svg.arrow(W / 2, top + th, W / 2, 146)
    svg.text(W / 2 + 8, 134, "start task workflows, wait for results, read trajectories (gRPC)",
             size=11, fill="#5f6368")  # fmt: skip

    # Temporal in the middle, a queue chip over each fleet
    ty, tht = 148, 84
    svg.rect(M, ty, W - 2 * M, tht, fill="#f1f3f4", stroke="#80868b")
    svg.text(M + 12, ty + 22, "Temporal: workflow histories and task queues", size=13, bold=True)
    cw = (W - 2 * M - 3 * GAP) / 4
    fy, fh = 272, 300
    for i, (name, fleet) in enumerate(fleets.items()):
        x = M + i * (cw + GAP)
        queues = list(fleet.queues)
        chip = " + ".join([queues[0]] + ["@{host}" for q in queues[1:] if q != queues[0]])
        svg.rect(x + 8, ty + 36, cw - 16, 36, fill=TINTS[name], stroke=COLOURS[name])
        svg.text(x + cw / 2, ty + 59, chip, size=11, mono=True, anchor="middle")
        svg.arrow(x + cw / 2, ty + 72, x + cw / 2, fy - 2, colour=COLOURS[name])
        svg.text(x + cw / 2 + 6, fy - 16, "polls", size=10, fill="#5f6368")

    # the four fleets
    for i, (name, fleet) in enumerate(fleets.items()):
        x = M + i * (cw + GAP)
        svg.rect(x, fy, cw, fh, fill=TINTS[name], stroke=COLOURS[name], width=1.6)
        svg.rect(x, fy, cw, 30, fill=COLOURS[name], stroke=COLOURS[name])
        svg.text(x + 10, fy + 20, f"{name} fleet", size=13, bold=True, fill="#ffffff")
        svg.text(x + 10, fy + 46, f"rolloutd worker --fleet {name}", size=10, mono=True,
                 fill="#5f6368")  # fmt: skip
        y = fy + 68
        for queue, names in fleet.queues.items():
            svg.text(x + 10, y, f"{queue}:", size=10.5, mono=True, bold=True)
            y += 15
            for line in _wrap(names, 34, ", "):
                svg.text(x + 16, y, line, size=10.5, mono=True)
                y += 14
            y += 6
        if name == "sandbox":
            bx, by, bw, bh = x + 10, fy + fh - 142, cw - 20, 132
            svg.rect(bx, by, bw, bh, fill="#ffffff", stroke=COLOURS[name])
            svg.text(bx + 8, by + 17, "runtime, one per session:", size=11, bold=True)
            y = by + 32
            for line in _wrap(parts["runtimes"], 34, " · "):
                svg.text(bx + 8, y, line, size=10, mono=True)
                y += 14
            svg.text(bx + 8, y + 5, "harness (unmodified agent CLI):", size=11, bold=True)
            for j, line in enumerate(_wrap(parts["harnesses"], 34, " · ")):
                svg.text(bx + 8, y + 20 + 14 * j, line, size=10, mono=True)
            harness_y = by + bh / 2
            harness_x = bx + bw
        if name == "gateway":
            gx, gy, gw, gh = x + 10, fy + fh - 142, cw - 20, 132
            svg.rect(gx, gy, gw, gh, fill="#ffffff", stroke=COLOURS[name])
            svg.text(gx + 8, gy + 17, "HTTP gateway /s/{session_key}/", size=11, bold=True)
            for j, line in enumerate(_wrap(parts["dialects"], 36, " · ")):
                svg.text(gx + 8, gy + 33 + 14 * j, line, size=10, mono=True)
            svg.text(gx + 8, gy + 88, "the harness's LLM provider; records", size=10.5)
            svg.text(gx + 8, gy + 103, "every completion token by token:", size=10.5)
            svg.text(gx + 8, gy + 120, "prompt ids, sampled ids, logprobs", size=10, mono=True)
            gateway_x, gateway_y = gx, gy + gh / 2
            engine_x = gx + gw / 2
    svg.arrow(harness_x, harness_y, gateway_x, gateway_y)
    svg.text((harness_x + gateway_x) / 2, harness_y - 20, "model", size=10, fill="#5f6368",
             anchor="middle")  # fmt: skip
    svg.text((harness_x + gateway_x) / 2, harness_y - 7, "calls", size=10, fill="#5f6368",
             anchor="middle")  # fmt: skip

    # engine under the gateway, blob store under the rest
    ey = fy + fh + 34
    svg.arrow(engine_x, fy + fh, engine_x, ey)
    svg.text(engine_x + 6, fy + fh + 20, "token ids → sampled ids, logprobs", size=10,
             fill="#5f6368")  # fmt: skip
    ex = M + 2 * (cw + GAP)
    svg.rect(ex, ey, cw, 50, fill="#f8f9fa")
    svg.text(ex + 10, ey + 20, "inference engine (backend):", size=11.5, bold=True)
    svg.text(ex + 10, ey + 38, " · ".join(parts["backends"]), size=10, mono=True)
    svg.rect(M, ey, 2 * cw + GAP, 50, fill="#f8f9fa")
    svg.text(M + 10, ey + 20, "blob store (an fsspec URL)", size=11.5, bold=True)
    svg.text(M + 10, ey + 38, "completion logs, artifacts, trajectories; payloads carry references",
             size=10.5)  # fmt: skip

    # one session's path
    py = ey + 78
    svg.text(M, py, "One session: RolloutSessionWorkflow (workflows fleet) runs these activities "
             "in order, each on its fleet's queue; the runtime is torn down always",
             size=12.5, bold=True)  # fmt: skip
    n = len(steps)
    sw = (W - 2 * M - (n - 1) * 14) / n
    for i, (activity, fleet, queue) in enumerate(steps):
        x = M + i * (sw + 14)
        svg.rect(x, py + 14, sw, 76, fill=TINTS[fleet], stroke=COLOURS[fleet], width=1.6)
        svg.text(x + sw / 2, py + 34, f"{i + 1}", size=13, bold=True, fill=COLOURS[fleet],
                 anchor="middle")  # fmt: skip
        svg.text(x + sw / 2, py + 52, activity, size=10.5, mono=True, bold=True, anchor="middle")
        svg.text(x + sw / 2, py + 67, f"{fleet} fleet", size=10, anchor="middle")
        svg.text(x + sw / 2, py + 81, queue, size=8.6, mono=True, fill="#5f6368",
                 anchor="middle")  # fmt: skip
        if i < n - 1:
            svg.arrow(x + sw + 1, py + 52, x + sw + 13, py + 52)
    return svg.render()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the file is stale")
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the SVG")
    args = parser.parse_args()
    text = draw()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is stale: python scripts/draw_fleets.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
