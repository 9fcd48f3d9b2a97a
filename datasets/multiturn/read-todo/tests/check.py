"""The checker of this task (wharf/tasks/tools/judge.py): each check gets a read-only view of the
workspace the agent left and fails by raising; nothing of the workspace is imported here."""


def test_result(state):
    assert state.read_text('done.txt').strip() == 'saffron'


def test_kept(state):
    assert 'todo' in state.read_text('TODO')
