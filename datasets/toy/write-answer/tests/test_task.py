from pathlib import Path

def test_answer():
    assert Path("answer.txt").read_text().strip() == "42"

def test_question_kept():
    assert "six times seven" in Path("question.txt").read_text()
