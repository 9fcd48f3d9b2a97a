from pathlib import Path

def test_hello_file():
    assert Path("hello.txt").read_text().strip() == "hello"

def test_readme_kept():
    assert Path("README.md").exists()
