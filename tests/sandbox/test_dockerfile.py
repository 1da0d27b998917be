"""The images a Dockerfile names, read as the builder reads them: ``FROM`` after its build
arguments, ``COPY --from``, ``RUN --mount=from=``, the ``syntax`` directive; what cannot be
resolved without guessing is refused. Pure: no container runtime."""

from __future__ import annotations

import pytest

from rolloutd.dockerfile import UnresolvableError, image_references

BASE = "localhost/rolloutd-base:bookworm"
WITH_ARG = f"ARG BASE_IMAGE={BASE}\nFROM ${{BASE_IMAGE}}\nRUN true\n"


def test_from_is_read_after_the_build_arguments() -> None:
    assert image_references(WITH_ARG, {}) == [BASE]  # the default, as the examples build
    assert image_references(WITH_ARG, {"BASE_IMAGE": "docker.io/x/y:1"}) == ["docker.io/x/y:1"]
    # the six expansion forms, unset and set
    text = "ARG A\nARG B=\nFROM ${A:-one}\nFROM ${B-two}x\nFROM ${A+three}four\n"
    assert image_references(text, {}) == ["one", "x", "four"]
    assert image_references(text, {"A": "set", "B": "b"}) == ["set", "bx", "threefour"]
    # an ARG default made of an earlier one; a build argument replaces only a declared one
    chained = "ARG R=localhost\nARG I=$R/base\nFROM $I\n"
    assert image_references(chained, {"R": "quay.io"}) == ["quay.io/base"]


def test_every_image_an_instruction_pulls_is_a_reference_and_stages_are_not() -> None:
    text = (
        "# syntax=docker/dockerfile:1\n"
        "FROM --platform=linux/amd64 localhost/a AS build\n"
        "FROM build\n"
        "COPY --from=build /x /y\n"
        "COPY --from=0 /x /y\n"
        "COPY --chown=1 --from=docker.io/library/alpine /bin/sh /sh\n"
        "RUN --mount=type=bind,from=busybox,target=/b true\n"
        "FROM scratch\n"
    )
    assert image_references(text, {}) == [
        "docker/dockerfile:1",
        "localhost/a",
        "docker.io/library/alpine",
        "busybox",
    ]
    # a stage named after it is defined is an image where it is used before
    assert image_references("FROM evil\nFROM localhost/a AS evil\n", {}) == [
        "evil",
        "localhost/a",
    ]


def test_a_line_hidden_by_a_continuation_is_still_read() -> None:
    # with the backtick as escape character, a trailing backslash continues nothing
    assert image_references("# escape=`\nFROM a\nRUN echo \\\nFROM evil\n", {}) == ["a", "evil"]
    # a heredoc whose delimiter ends in the escape character: joined, the FROM after it
    # would vanish; every physical line is read on its own too
    assert "evil" in image_references("FROM a\nRUN <<'E\\'\nx\nE\\\nFROM evil\n", {})
    # a FROM split over lines, and comments inside a continuation
    assert image_references("FROM \\\n  # the base\n  localhost/x\n", {}) == ["localhost/x"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("FROM $X\n", "not a build argument declared"),
        ("FROM a\nARG X=b\nFROM $X\n", "not a build argument declared"),  # a stage's ARG
        ("ARG X\nFROM $X\n", "has no value"),
        ("ARG X=a\nFROM ${X%a}\n", "not resolved"),
        ("ARG X=a\nFROM ${X:-${X}}\n", "not resolved"),
        ("FROM a\nCOPY --from=$X /a /b\n", "variable in a stage or image name"),
        ("# escape=\\\n# escape=`\nFROM a\n", "given twice"),
        ('ARG X="a\nFROM a\n', "No closing quotation"),
    ],
)
def test_what_cannot_be_resolved_is_refused(text: str, why: str) -> None:
    with pytest.raises(UnresolvableError, match=why):
        image_references(text, {"X": "x"} if "COPY" in text else {})


def test_a_preprocessed_containerfile_is_refused() -> None:
    """podman runs a ``.in`` Containerfile through cpp, whose ``#include`` brings in lines
    this reading never sees."""
    with pytest.raises(UnresolvableError, match="preprocessor"):
        image_references(f'FROM {BASE}\n#include "other"\n', {}, name="Containerfile.in")


def test_context_sources_are_what_copy_and_add_read_from_the_context() -> None:
    from rolloutd.dockerfile import context_sources

    text = "\n".join(
        [
            "FROM debian",
            "COPY repo /testbed",
            'COPY --chown=1000:1000 --chmod=644 a.txt "b c.txt" /dest/',
            'ADD ["d.tar", "/d"]',
            "COPY --from=builder /out /out",
            "ADD https://example.com/x.tgz /x",
            "COPY <<EOT /f",
            "hi",
            "EOT",
            "COPY ${SRC} /s",
            "COPY patches/*.diff \\",
            "     /p/",
            "copy repo /again",
        ]
    )
    assert context_sources(text) == ["repo", "a.txt", "b c.txt", "d.tar", "patches/*.diff"]
