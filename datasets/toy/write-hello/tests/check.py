"""The checker of this task (wharf/tasks/tools/judge.py): each check gets a read-only view of the
workspace the agent left and fails by raising; nothing of the workspace is imported here."""


def test_hello_file(state):
    assert state.read_text("hello.txt").strip() == "hello"

def test_readme_kept(state):
    assert state.exists("README.md")
