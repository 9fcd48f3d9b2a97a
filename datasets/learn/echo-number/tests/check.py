"""The checker of this task (wharf/tasks/tools/judge.py): each check gets a read-only view of the
workspace the agent left and fails by raising; nothing of the workspace is imported here."""


def test_result(state):
    assert state.read_text("count.txt").strip() == "7"


def test_kept(state):
    assert "week" in state.read_text("notes.txt")
