"""Write the task dirs of datasets/multiturn (run from the repo root: python datasets/multiturn/make_tasks.py).

Each task hides one value drawn here (a word, a number, a file name) in the sandbox: the
instruction names the command that shows it and the command that saves it, with a placeholder
where the value goes. Solving takes two model calls, the second depending on what the first
observed. The values are drawn from a fixed seed, so running this again writes the same files.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 17
WORDS = ["tulip", "falcon", "copper", "meadow", "violet", "harbor", "pepper", "lantern", "walnut",
         "orchid", "glacier", "canyon", "saffron", "pebble", "thistle", "marble"]

TOML = """[metadata]
difficulty = "easy"
category = "multiturn"
tags = ["multiturn", "shell", "observe"]

[agent]
timeout_sec = 600.0

[verifier]
timeout_sec = 300.0

[environment]
workdir = "/app"
"""
TEST_SH = """#!/bin/bash
# SWE-bench-style grading of test_task.py: collect/tasks/grade_pytest.sh, which the bwrap
# sandbox exports as $WHARF_TASK_TOOLS.
exec bash "${WHARF_TASK_TOOLS:-/tests}/grade_pytest.sh" /app test_task.py
"""


def instruction(what: str, show: str, save: str, placeholder: str) -> str:
    return (f"{what}\nFirst run this command to see it:\n\n{show}\n\n"
            f"Then run this command with {placeholder} replaced by what you saw:\n\n{save}\n")


def tasks(rng: random.Random) -> list[dict]:
    """name -> files, instruction, the value, the oracle's command (which reads the value itself)."""
    w = rng.sample(WORDS, 4)
    a, b, c = rng.randrange(11, 40), rng.randrange(13, 60), rng.randrange(100, 999)
    n_lines = rng.randrange(5, 10)
    names = rng.sample(WORDS, n_lines)
    port, err = rng.randrange(3000, 9000), rng.randrange(400, 600)
    version = f"{rng.randrange(2, 9)}.{rng.randrange(0, 20)}.{rng.randrange(0, 10)}"
    return [
        dict(name="cat-word", value=w[0], files={"word.txt": f"The secret word is {w[0]}.\n"},
             text=instruction("The file word.txt holds a secret word. Save that word in answer.txt.",
                              "cat word.txt", "echo WORD > answer.txt", "WORD"),
             oracle="echo $(sed 's/.* is \\(.*\\)\\./\\1/' word.txt) > answer.txt", out="answer.txt",
             kept=("word.txt", "secret word")),
        dict(name="run-script", value=str(a * b), files={"code.py": f"print('code:', {a} * {b})\n"},
             text=instruction("The script code.py prints a code. Save that code in answer.txt.",
                              "python3 code.py", "echo CODE > answer.txt", "CODE"),
             oracle="echo $(python3 code.py | cut -d' ' -f2) > answer.txt", out="answer.txt",
             kept=("code.py", "print")),
        dict(name="ls-name", value=w[1], files={f"box/{w[1]}.txt": "inside\n"},
             text=instruction("The folder box holds one file. Save its name, without .txt, in name.txt.",
                              "ls box", "echo NAME > name.txt", "NAME"),
             oracle="echo $(basename box/*.txt .txt) > name.txt", out="name.txt", kept=(f"box/{w[1]}.txt", "inside")),
        dict(name="count-lines", value=str(n_lines), files={"names.txt": "".join(f"{x}\n" for x in names)},
             text=instruction("Count the lines of names.txt and save the number in count.txt.",
                              "wc -l names.txt", "echo NUMBER > count.txt", "NUMBER"),
             oracle="echo $(wc -l < names.txt) > count.txt", out="count.txt", kept=("names.txt", names[0])),
        dict(name="json-port", value=str(port), files={"config.json": json.dumps({"name": "web", "port": port}) + "\n"},
             text=instruction("config.json sets a port. Save the port number in port.txt.",
                              "cat config.json", "echo PORT > port.txt", "PORT"),
             oracle="python3 -c 'import json; print(json.load(open(\"config.json\"))[\"port\"])' > port.txt",
             out="port.txt", kept=("config.json", "web")),
        dict(name="failing-check", value=str(c),
             files={"check.py": f"want = {c // 7} * 7 + {c % 7}\nhave = int(open('n.txt').read())\n"
                                "assert have == want, f'expected {want}, got {have}'\nprint('ok')\n",
                    "n.txt": "0\n"},
             text=instruction("The check in check.py fails. Its error says which number n.txt must hold: put it there.",
                              "python3 check.py", "echo NUMBER > n.txt", "NUMBER"),
             oracle="echo $(python3 check.py 2>&1 | sed -n 's/.*expected \\([0-9]*\\).*/\\1/p') > n.txt",
             out="n.txt", kept=("check.py", "want")),
        dict(name="grep-error", value=str(err),
             files={"app.log": "".join(f"INFO request {i} served\n" for i in range(12)) + f"ERROR code {err}\n"
                    + "".join(f"INFO request {i} served\n" for i in range(12, 20))},
             text=instruction("app.log has one ERROR line with a code. Save that code in code.txt.",
                              "grep ERROR app.log", "echo CODE > code.txt", "CODE"),
             oracle="echo $(grep ERROR app.log | cut -d' ' -f3) > code.txt", out="code.txt", kept=("app.log", "INFO")),
        dict(name="tool-version", value=version,
             files={"tool.py": f"import sys\nif '--version' in sys.argv:\n    print('tool version', '{version}')\n"},
             text=instruction("tool.py reports its version. Save the version in version.txt.",
                              "python3 tool.py --version", "echo VERSION > version.txt", "VERSION"),
             oracle="echo $(python3 tool.py --version | cut -d' ' -f3) > version.txt", out="version.txt",
             kept=("tool.py", "version")),
    ]


def test_file(t: dict) -> str:
    kept_file, kept_text = t["kept"]
    return (f"from pathlib import Path\n\n\ndef test_result():\n"
            f"    assert Path({t['out']!r}).read_text().strip() == {t['value']!r}\n\n\n"
            f"def test_kept():\n    assert {kept_text!r} in Path({kept_file!r}).read_text()\n")


def write(t: dict, root: Path) -> None:
    d = root / t["name"]
    shutil.rmtree(d, ignore_errors=True)
    for rel, text in t["files"].items():
        (d / "environment" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "environment" / rel).write_text(text)
    (d / "instruction.md").write_text(t["text"])
    (d / "task.toml").write_text(TOML)
    (d / "solution").mkdir()
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\nset -e\ncd /app\n{t['oracle']}\n")
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text(TEST_SH)
    (d / "tests" / "test_task.py").write_text(test_file(t))
    spec = {"instance_id": f"multiturn__{t['name']}", "repo": f"wharf/multiturn-{t['name']}", "version": "1",
            "FAIL_TO_PASS": ["test_task.py::test_result"], "PASS_TO_PASS": ["test_task.py::test_kept"],
            "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
    (d / "tests" / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    for sh in (d / "solution" / "solve.sh", d / "tests" / "test.sh"):
        sh.chmod(0o755)


def main() -> None:
    for t in tasks(random.Random(SEED)):
        write(t, HERE)
        print(f"{t['name']}: {t['value']}")


if __name__ == "__main__":
    main()
