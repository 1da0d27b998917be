"""The pieces every trainer bridge shares (no trainer package needed)."""

import pytest

from rolloutd.trainer_client.bridges.common import TASK_FIELDS, instruction_of
from rolloutd.types import TaskRequest


def test_instruction_of_takes_text_or_the_last_user_message():
    assert instruction_of("fix the bug") == "fix the bug"
    conversation = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second"},
    ]
    assert instruction_of(conversation) == "second"


@pytest.mark.parametrize(
    "prompt",
    [[], [{"role": "system", "content": "x"}], [{"role": "user", "content": [{"type": "text"}]}]],
)
def test_instruction_of_names_the_prompt_it_cannot_read(prompt):
    with pytest.raises(ValueError, match="raw_prompt needs a last user message"):
        instruction_of(prompt, "raw_prompt")


def test_task_fields_are_task_request_fields():
    assert set(TASK_FIELDS) <= set(TaskRequest.model_fields)
