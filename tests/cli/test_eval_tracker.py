"""``rolloutd eval --tracker``'s series (:class:`rolloutd.cli.evaluation.EvalTracking`), fed a
results file recorded from a real eval (``data/humaneval_results.jsonl``: 4 HumanEval problems
x 2 samples of Qwen2.5-Coder-0.5B on the gateway, from ``test_eval_stack.py``'s HumanEval run)
and read back with TensorBoard's own reader (``event_accumulator``). No stack: the eval path
that calls the same class on a live stack is ``test_eval.py``'s scripted-harness test.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rolloutd.cli.commands.evaluate import TRACKER_CHOICES
from rolloutd.cli.evaluation import EvalTracking, summary_metrics
from rolloutd.cli.results import ResultsFile, group_of, summarize
from rolloutd.trainer_client.tracking import TRACKERS, RolloutTracker
from tests.support.bridges import have
from tests.support.tensorboard_events import events, scalars

DATA = Path(__file__).parent / "data"


def test_the_parsers_choices_are_the_trackers() -> None:
    assert TRACKER_CHOICES == TRACKERS


@pytest.mark.skipif(not have("tensorboard"), reason="pip install 'rolloutd[tensorboard]'")
def test_each_group_and_the_summary_reach_tensorboard(tmp_path) -> None:
    shutil.copy(DATA / "humaneval_results.jsonl", tmp_path / "results.jsonl")
    tasks = list(ResultsFile(tmp_path).read().values())
    assert len(tasks) == 4
    summary = summarize(tasks, k=2)
    groups = [group_of(lines) for lines in tasks]
    # a resumed run: one task was in the file before this invocation
    with RolloutTracker("tensorboard", log_dir=tmp_path / "tb") as tracker:
        tracking = EvalTracking(tracker, tasks_done=1)
        for group in groups[1:]:
            tracking.group(group)
        tracking.end(summary, groups)

    got = scalars(tmp_path / "tb")
    # one batch a task, steps going on from the tasks already done
    rewards = [[line.reward for line in lines] for lines in tasks[1:]]
    assert got["rolloutd/reward_mean"] == [
        (step, sum(r) / len(r)) for step, r in enumerate(rewards, start=2)
    ]
    tokens = [sum(x.num_sampled_tokens for x in lines) / len(lines) for lines in tasks[1:]]
    assert [v for _, v in got["rolloutd/tokens_per_session"]] == pytest.approx(tokens)
    assert [v for _, v in got["rolloutd/turns_per_session"]] == [1.0, 1.0, 1.0]
    assert [v for _, v in got["rolloutd/failures/backend"]] == [0.0, 0.0, 0.0]
    # the summary at the last step: what summary.json holds
    assert summary.pass_at_1 == 0.75 and summary.mean_reward == 0.75
    for name, value in summary_metrics(summary).items():
        assert got[name] == [(4, pytest.approx(value))], name
    assert "rolloutd/eval/pass_at_k" in got and "rolloutd/eval/failures/none" in got
    [folder] = {p.parent for p in (tmp_path / "tb").rglob("events.out.tfevents.*")}
    [table] = events(folder).Tensors("rolloutd/samples")
    text = table.tensor_proto.string_val[0].decode()
    assert text.count("HumanEval_") == 8 and "| task | sample | reward |" in text
