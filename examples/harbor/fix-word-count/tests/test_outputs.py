import sys

sys.path.insert(0, "/app/textstats")

from textstats import average_word_length, word_count  # noqa: E402


def test_runs_of_spaces():
    assert word_count("a  b   c") == 3


def test_tabs_and_newlines():
    assert word_count("one\ttwo\nthree  four\n") == 4


def test_empty_text():
    assert word_count("") == 0
    assert word_count("   ") == 0


def test_average_word_length():
    assert average_word_length("ab  abcd") == 3.0
    assert average_word_length("") == 0.0
