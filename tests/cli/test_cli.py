"""The command line explains itself: ``--version`` and help on every option of every command."""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys

import pytest

from rolloutd.cli.parser import build_parser


def _walk(parser: argparse.ArgumentParser, path: str):
    """Yield (command path, action) for every action of ``parser`` and its subcommands."""
    for action in parser._actions:
        yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, f"{path} {name}")


def test_every_option_and_positional_has_help():
    actions = list(_walk(build_parser(), "rolloutd"))
    # the walk reached nested subcommands (models pull), so a missing level would show
    assert any(path == "rolloutd models pull" for path, _ in actions)
    missing = [
        f"{path}: {action.option_strings or action.dest}"
        for path, action in actions
        if not action.help or action.help == argparse.SUPPRESS
    ]
    assert missing == []


def test_help_shows_defaults():
    engine = build_parser()._subparsers._group_actions[0].choices["engine"]
    text = " ".join(engine.format_help().split())  # the formatter wraps lines
    assert "context window shared by all slots, tokens (default: 32768)" in text


def test_version_prints_the_installed_version():
    out = subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == f"rolloutd {importlib.metadata.version('rolloutd')}"


def test_version_exits_zero_without_a_command():
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--version"])
    assert exit_info.value.code == 0


def test_every_command_module_gives_its_commands():
    """The parser is built from the modules of rolloutd.cli.commands: each command a module
    gives answers with its own handler."""
    sub = build_parser()._subparsers._group_actions[0]
    assert set(sub.choices) == {
        "codec-key",
        "codec-server",
        "demo",
        "doctor",
        "engine",
        "eval",
        "generate",
        "models",
        "quota",
        "reliability",
        "rejudge",
        "rest",
        "reverify",
        "schedule",
        "settings",
        "status",
        "store",
        "submit",
        "tasks",
        "tenant-token",
        "up",
        "view",
        "worker",
    }
    args = build_parser().parse_args(["models", "list"])
    assert args.handler.__module__ == "rolloutd.cli.commands.models"
