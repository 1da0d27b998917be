"""Word counts."""


def words(text: str) -> list[str]:
    """The words of ``text``."""
    return text.split(" ")


def word_count(text: str) -> int:
    """How many words ``text`` holds."""
    return len(words(text))


def average_word_length(text: str) -> float:
    """The mean length of the words of ``text``."""
    found = words(text)
    return sum(len(w) for w in found) / len(found)
