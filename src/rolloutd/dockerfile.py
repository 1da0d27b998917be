"""The images a Dockerfile makes its builder pull or read, as the builder resolves them.

A task's ``runtime.build`` names a Dockerfile and build arguments; the sandbox policy's
``images`` bounds the images a task may run, so it must also bound the images a build starts
from. ``ARG BASE_IMAGE=allowed`` then ``FROM ${BASE_IMAGE}`` with the build argument
``BASE_IMAGE=anything`` starts from ``anything``: ``FROM`` is read after the arguments.

Rules (Dockerfile reference, "Parser directives", "Escape", "Understand how ARG and FROM
interact", "Environment replacement", ``COPY --from``, ``RUN --mount``):

- parser directives are the leading ``# name=value`` comments; ``escape`` sets the line
  continuation character (``\\`` or a backtick); ``syntax`` names the BuildKit frontend, an
  image docker pulls and runs, so it is a reference too;
- a line ending in the escape character (blanks after it allowed) continues on the next;
  comment and blank lines inside a continuation are dropped;
- ``ARG name[=default]`` lines before the first ``FROM`` are the arguments ``FROM`` sees; a
  build argument replaces the default of an argument declared there; ``$name``, ``${name}``,
  ``${name:-word}``, ``${name-word}``, ``${name:+word}`` and ``${name+word}`` are expanded;
- ``FROM [--flag=...] image [AS name]``: ``scratch`` and an earlier stage's name are no image;
- ``COPY --from=x`` and ``RUN --mount=...,from=x``: ``x`` is an earlier stage (its name or
  index) or an image.

What cannot be resolved is refused, never guessed: a variable ``FROM`` uses that no ``ARG``
before the first ``FROM`` declares, one with no value, another expansion form, a variable in
``--from``/``from=``, and a ``.in`` Containerfile (podman runs it through the C preprocessor,
whose ``#include`` can bring other lines in). Every physical line is read a second time on
its own, so a line that one reading joins to its neighbour (a heredoc whose delimiter ends in
the escape character) still has its references checked.
"""

from __future__ import annotations

import json
import re
import shlex

#: directives a parser takes (BuildKit's; any other ``# x=y`` line is a comment, and ends them)
DIRECTIVES = ("syntax", "escape", "check")

_DIRECTIVE = re.compile(r"^#\s*([A-Za-z]+)\s*=\s*(.*?)\s*$")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_VARIABLE = re.compile(rf"\$(?:\{{({_NAME})(?:(:?[-+])([^{{}}$]*))?\}}|({_NAME}))")


class UnresolvableError(ValueError):
    """A Dockerfile's image references cannot be told without guessing (the message says
    which line and why)."""


def _directives(lines: list[str]) -> tuple[dict[str, str], int]:
    """The parser directives and the index of the first line after them."""
    found: dict[str, str] = {}
    for index, line in enumerate(lines):
        match = _DIRECTIVE.match(line.strip())
        if not match or match.group(1).lower() not in DIRECTIVES:
            return found, index
        key = match.group(1).lower()
        if key in found:
            raise UnresolvableError(f"the parser directive {key!r} is given twice")
        found[key] = match.group(2)
    return found, len(lines)


def _logical_lines(lines: list[str], escape: str) -> list[str]:
    """Instructions with their continuation lines joined, comments and blanks dropped."""
    out: list[str] = []
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        body = line.rstrip()
        if body.endswith(escape):
            current = (current or "") + body[: -len(escape)] + " "
            continue
        out.append((current or "") + line)
        current = None
    if current is not None:
        out.append(current)
    return out


def expand(word: str, values: dict[str, str | None], where: str) -> str:
    """``word`` with its variables replaced from ``values`` (None: declared, no value).

    Raises:
        UnresolvableError: an undeclared variable, one with no value where its value is
            used, or a form other than the six of the module docstring.
    """

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(4)
        operator, alternative = match.group(2), match.group(3) or ""
        if name not in values:
            raise UnresolvableError(
                f"{where}: ${name} is not a build argument declared (ARG) before the first FROM"
            )
        value = values[name]
        if operator in (":-", "-"):
            unset = value is None or (operator == ":-" and value == "")
            return expand(alternative, values, where) if unset else str(value)
        if operator in (":+", "+"):
            present = value is not None and (operator == "+" or value != "")
            return expand(alternative, values, where) if present else ""
        if value is None:
            raise UnresolvableError(f"{where}: build argument {name} has no value")
        return value

    out = _VARIABLE.sub(one, word)
    if "$" in out:
        raise UnresolvableError(f"{where}: {word!r} uses an expansion that is not resolved here")
    return out


def _arg_pairs(rest: str, where: str) -> list[tuple[str, str | None]]:
    try:
        words = shlex.split(rest, comments=False, posix=True)
    except ValueError as e:
        raise UnresolvableError(f"{where}: {e}") from None
    pairs: list[tuple[str, str | None]] = []
    for word in words:
        name, eq, default = word.partition("=")
        if not re.fullmatch(_NAME, name):
            raise UnresolvableError(f"{where}: {name!r} is not an argument name")
        pairs.append((name, default if eq else None))
    return pairs


class _Reader:
    """One reading of the instructions (joined or physical lines): the references it finds."""

    def __init__(self, args: dict[str, str], *, lenient: bool) -> None:
        self.args = args
        #: physical lines alone: a line that is part of a longer instruction is skipped when
        #: it does not parse (the joined reading has the whole instruction)
        self.lenient = lenient
        self.values: dict[str, str | None] = {}
        self.stages: list[str] = []
        self.seen_from = False
        self.references: list[str] = []

    def _source(self, name: str, where: str) -> None:
        """A ``--from``/``from=`` value: an earlier stage, or an image."""
        if "$" in name:
            raise UnresolvableError(f"{where}: a variable in a stage or image name ({name!r})")
        if name.isdigit() or name.lower() in self.stages:
            return
        self.references.append(name)

    def read(self, line: str, where: str) -> None:
        words = line.split(None, 1)
        if not words:
            return
        instruction, rest = words[0].upper(), (words[1] if len(words) > 1 else "")
        if instruction == "ONBUILD":  # what images built on this one would run: checked too
            self.read(rest, where)
            return
        if instruction == "ARG" and not self.seen_from:
            try:
                pairs = _arg_pairs(rest, where)
            except UnresolvableError:
                if self.lenient:
                    return
                raise
            for name, default in pairs:
                if name in self.args:
                    self.values[name] = self.args[name]
                else:
                    self.values[name] = (
                        None if default is None else expand(default, self.values, where)
                    )
        elif instruction == "FROM":
            self.seen_from = True
            tokens = [t for t in rest.split() if not t.startswith("--")]
            if not tokens:
                if self.lenient:
                    return
                raise UnresolvableError(f"{where}: FROM names no image")
            image = expand(tokens[0], self.values, where)
            if not image or any(c.isspace() for c in image):
                raise UnresolvableError(f"{where}: FROM {tokens[0]} resolves to {image!r}")
            if image.lower() != "scratch" and image.lower() not in self.stages:
                self.references.append(image)
            if len(tokens) >= 3 and tokens[1].upper() == "AS":
                self.stages.append(tokens[2].lower())
        elif instruction in ("COPY", "ADD"):
            for token in rest.split():
                if token.lower().startswith("--from="):
                    self._source(token.split("=", 1)[1], where)
        elif instruction == "RUN":
            for token in rest.split():
                if not token.lower().startswith("--mount="):
                    continue
                for option in token.split("=", 1)[1].split(","):
                    key, _, value = option.partition("=")
                    if key.strip().lower() == "from":
                        self._source(value.strip().strip("\"'"), where)


def image_references(
    dockerfile: str, args: dict[str, str], *, name: str = "Dockerfile"
) -> list[str]:
    """Every image a Dockerfile makes its builder use, in order, each once.

    Args:
        dockerfile: the Dockerfile's text.
        args: the build arguments (``--build-arg``), name -> value.
        name: the Dockerfile's name, for messages (a ``.in`` file is refused).

    Returns:
        Image references as written after expansion (``localhost/rolloutd-base:bookworm``),
        without stages and ``scratch``; the ``syntax`` directive's image first when present.

    Raises:
        UnresolvableError: what the module docstring lists as refused.
    """
    if name.endswith(".in"):
        raise UnresolvableError(
            f"{name}: a .in Containerfile is run through the C preprocessor; not accepted"
        )
    lines = dockerfile.splitlines()
    directives, first = _directives(lines)
    escape = directives.get("escape", "\\")
    if escape not in ("\\", "`"):
        raise UnresolvableError(f"{name}: escape directive {escape!r} is neither \\ nor `")
    found: list[str] = [directives["syntax"]] if directives.get("syntax") else []
    joined = _Reader(args, lenient=False)
    for index, line in enumerate(_logical_lines(lines[first:], escape)):
        joined.read(line, f"{name}, instruction {index + 1}")
    physical = _Reader(args, lenient=True)
    for number, line in enumerate(lines[first:], start=first + 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        body = line.rstrip()
        physical.read(body[: -len(escape)] if body.endswith(escape) else body, f"{name}:{number}")
    for reference in [*found, *joined.references, *physical.references]:
        if reference not in found:
            found.append(reference)
    return found


def context_sources(dockerfile: str) -> list[str]:
    """The build-context paths a Dockerfile's ``COPY`` and ``ADD`` read, in order, each once.

    A source that is not the context's is left out: ``COPY --from`` (a stage or an image), a
    URL or git address (``ADD``), a heredoc (``COPY <<EOF``), and a path holding a variable
    (expanded by the builder from ``ARG``/``ENV``). Shell form and JSON form are read
    (Dockerfile reference, ``COPY``/``ADD``); flags (``--chown=...``) are skipped.

    Args:
        dockerfile: the Dockerfile's text.

    Returns:
        Sources as written (relative to the context; they may hold ``*``/``?`` patterns).

    Raises:
        UnresolvableError: a bad ``escape`` parser directive.
    """
    lines = dockerfile.splitlines()
    directives, first = _directives(lines)
    escape = directives.get("escape", "\\")
    if escape not in ("\\", "`"):
        raise UnresolvableError(f"escape directive {escape!r} is neither \\ nor `")
    found: list[str] = []
    for line in _logical_lines(lines[first:], escape):
        instruction, _, rest = line.strip().partition(" ")
        if instruction.upper() not in ("COPY", "ADD") or "<<" in rest:
            continue
        rest = rest.strip()
        words: list[str] = []
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            words.append(flag)
            rest = rest.strip()
        if any(flag.lower().startswith("--from") for flag in words):
            continue
        try:
            paths = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        except (ValueError, json.JSONDecodeError):
            continue
        if not isinstance(paths, list) or len(paths) < 2:
            continue
        for source in paths[:-1]:
            source = str(source)
            if "$" in source or "://" in source or source.startswith("git@"):
                continue
            if source not in found:
                found.append(source)
    return found
