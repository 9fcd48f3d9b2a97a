"""The checker of this task (wharf/tasks/tools/judge.py): each check gets a read-only view of the
workspace the agent left and fails by raising; nothing of the workspace is imported here."""


def test_answer(state):
    assert state.read_text("answer.txt").strip() == "42"

def test_question_kept(state):
    assert "six times seven" in state.read_text("question.txt")
