"""The checker of this task (wharf/tasks/tools/judge.py): each check gets a read-only view of the
workspace the agent left and fails by raising; nothing of the workspace is imported here (a value
or a call of the code comes back as plain data from a separate process)."""


def test_result(state):
    assert state.call("ops", "sub", 5, 3) == 2


def test_kept(state):
    assert state.call("ops", "mul", 2, 3) == 6
