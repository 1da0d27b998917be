"""Statistics of a text."""

from textstats.counts import average_word_length, word_count

__all__ = ["average_word_length", "word_count"]
