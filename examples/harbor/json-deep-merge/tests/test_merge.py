import copy
import json
import subprocess
import sys

sys.path.insert(0, "/app")

from merge import deep_merge  # noqa: E402


def test_nested_dicts_merge():
    base = {"a": 1, "b": {"c": 2, "d": [1, 2]}}
    override = {"b": {"d": [3], "e": None, "f": {"g": 1}}, "h": True}
    assert deep_merge(base, override) == {"a": 1, "b": {"c": 2, "d": [3], "f": {"g": 1}}, "h": True}


def test_none_removes_a_key():
    assert deep_merge({"a": 1, "b": 2}, {"a": None}) == {"b": 2}


def test_arguments_unchanged():
    base, override = {"a": {"b": 1}}, {"a": {"c": 2}}
    kept = copy.deepcopy((base, override))
    deep_merge(base, override)
    assert (base, override) == kept


def test_non_dicts_override():
    assert deep_merge({"a": 1}, [1]) == [1]
    assert deep_merge(3, {"a": 1}) == {"a": 1}


def test_command_line(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"z": 1, "y": {"x": 1}}))
    (tmp_path / "b.json").write_text(json.dumps({"y": {"w": 2}}))
    out = subprocess.run(
        [sys.executable, "/app/merge.py", str(tmp_path / "a.json"), str(tmp_path / "b.json")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == json.dumps({"y": {"w": 2, "x": 1}, "z": 1}, sort_keys=True, indent=2)
