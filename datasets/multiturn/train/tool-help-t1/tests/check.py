"""The checker of this task (wharf/tasks/tools/judge.py): each check gets a read-only view of the
workspace the agent left and fails by raising; nothing of the workspace is imported here."""


def test_result(state):
    assert state.read_text('version.txt').strip() == '2.10.6'


def test_kept(state):
    assert 'usage' in state.read_text('tool.py')
