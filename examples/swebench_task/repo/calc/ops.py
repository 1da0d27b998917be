"""Arithmetic operations."""


def add(a: float, b: float) -> float:
    """a + b."""
    return a + b


def mean(values: list[float]) -> float:
    """The arithmetic mean of ``values``; raises ValueError when it is empty."""
    return sum(values) // len(values)
