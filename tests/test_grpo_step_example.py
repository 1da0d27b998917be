"""examples/grpo_step.py runs for two steps and prints loss, mean reward, trainable fraction and
logprob mismatch per step.

It starts its own Temporal dev server and llama-server (SmolLM2-135M-Instruct): run it on its
own (``pytest -m slow tests/test_grpo_step_example.py``), not while the session's ``engine``
fixture serves another model on this machine. It takes about 3-5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.temporal]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grpo_step.py"
LINE = re.compile(r"^step (\d): loss=(-?[\d.]+) mean_reward=([\d.]+) "
                  r"trainable_fraction=([\d.]+) logprob_mismatch=([\d.]+)", re.M)


@pytest.mark.timeout(900)
def test_grpo_step_example_runs_two_steps(tmp_path):
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--steps", "2", "--home",
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=840)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    steps = LINE.findall(text)
    assert [s[0] for s in steps] == ["1", "2"], text[-3000:]
    for _, loss, reward, fraction, mismatch in steps:
        assert 0.0 < float(reward) < 1.0  # only informative (mixed) groups reach the trainer
        assert 0.0 < float(fraction) < 1.0
        assert float(mismatch) >= 0.0
