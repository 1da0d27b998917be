"""A tiny calculator package: the repository of the swebench-style example task."""
