"""Write the task dirs of datasets/multiturn (run from the repo root: python datasets/multiturn/make_tasks.py).

Each task hides one value drawn here (a word, a number) in the sandbox, in a file, a script's
output or a failing check's message; the instruction names the command that shows it, never
the value. Solving takes two model calls, the second depending on what the first observed:
six tasks show the whole second command (value included: copy it from the output), two show
only the value (put it in place of a placeholder in the command the instruction gives). The
values are drawn from a fixed seed, so running this again writes the same files.

The held-out split, heldout/ (never trained on: for `wharf eval` and `loop.eval_dataset`), holds
HELDOUT_COPIES instances of each kind, named <kind>-<i>, whose values come from other seeds:
seeds from HELDOUT_SEED up, each kept only when none of its values is a value of the training
split or of an instance kept before (so a policy that remembered the training values fails them).

The larger training split, train/ (for `collect.dataset`: more tasks of each kind a round, so that
a round's GRPO update rests on more than one task a kind), holds TRAIN_COPIES instances of each
kind, named <kind>-t<i>, drawn the same way from seeds TRAIN_SEED up, with values new to both the
eight tasks above and the held-out split.
"""
from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # datasets/taskdir.py, run as a script
from taskdir import TaskDir, check_file, task_toml, write  # noqa: E402

HERE = Path(__file__).resolve().parent
SEED = 17
HELDOUT_SEED = 1000
HELDOUT_COPIES = 2  # 16 held-out instances for the 8 trained on
TRAIN_SEED = 2000
TRAIN_COPIES = 2  # 16 more training instances: 64 trials a round at 4 attempts
WORDS = ["tulip", "falcon", "copper", "meadow", "violet", "harbor", "pepper", "lantern", "walnut",
         "orchid", "glacier", "canyon", "saffron", "pebble", "thistle", "marble"]

TAGS = ["multiturn", "shell", "observe"]
TOML = task_toml("multiturn", TAGS)


def instruction(what: str, show: str, save: str, placeholder: str) -> str:
    """A task whose second command takes the observed value in place of `placeholder`."""
    return (f"{what}\nFirst run this command to see it:\n\n{show}\n\n"
            f"Then run this command with {placeholder} replaced by what you saw:\n\n{save}\n")


def hinted(what: str, show: str) -> str:
    """A task whose first command shows the second one, value included: copy it from the output."""
    return f"{what}\nFirst run this command to see it:\n\n{show}\n\nThen run the command it shows.\n"


def run_line(value: str, out: str) -> str:
    return f"echo {value} > {out}"


def tasks(rng: random.Random) -> list[dict]:
    """Each task: files, instruction, the value, the file it goes in, the oracle's command (which
    reads the value in the sandbox itself) and a line of a file the task must leave in place."""
    w = rng.sample(WORDS, 3)
    a, b, c = rng.randrange(11, 40), rng.randrange(13, 60), rng.randrange(100, 999)
    n_lines = rng.randrange(5, 10)
    names = rng.sample(WORDS, n_lines)
    port, err = rng.randrange(3000, 9000), rng.randrange(400, 600)
    version = f"{rng.randrange(2, 9)}.{rng.randrange(0, 20)}.{rng.randrange(0, 10)}"
    shown = "sed -n 's/^echo \\(.*\\) > .*/\\1/p'"  # the oracle takes the value out of the shown command
    return [
        dict(name="cat-note", value=w[0], out="answer.txt", kept=("note.txt", "finish"),
             files={"note.txt": f"To finish the task, run this command:\n\n{run_line(w[0], 'answer.txt')}\n"},
             text=hinted("The file note.txt says how to finish the task.", "cat note.txt"),
             oracle=f"echo $({shown} note.txt) > answer.txt"),
        dict(name="run-script", value=str(a * b), out="answer.txt", kept=("hint.py", "print"),
             files={"hint.py": f"print('Now run this command:')\nprint()\nprint('echo', {a} * {b}, '> answer.txt')\n"},
             text=hinted("The script hint.py prints the command that finishes the task.", "python3 hint.py"),
             oracle=f"echo $(python3 hint.py | {shown}) > answer.txt"),
        dict(name="failing-check", value=str(c), out="n.txt", kept=("check.py", "want"),
             files={"check.py": f"want = {c // 7} * 7 + {c % 7}\nhave = int(open('n.txt').read())\n"
                                "assert have == want, f'n.txt is wrong. Fix it with this command:\\n\\necho {want} > n.txt'\n"
                                "print('ok')\n",
                    "n.txt": "0\n"},
             text=hinted("The check in check.py fails. Its error says how to fix n.txt.", "python3 check.py"),
             oracle=f"echo $(python3 check.py 2>&1 | {shown}) > n.txt"),
        dict(name="grep-log", value=str(err), out="code.txt", kept=("app.log", "INFO"),
             files={"app.log": "".join(f"INFO request {i} served\n" for i in range(12))
                    + f"ERROR code {err}. To record it, run: {run_line(str(err), 'code.txt')}\n"
                    + "".join(f"INFO request {i} served\n" for i in range(12, 20))},
             text=hinted("app.log has one ERROR line. It says how to record the error.", "grep ERROR app.log"),
             oracle="echo $(grep ERROR app.log | sed 's/.*run: echo \\([0-9]*\\) .*/\\1/') > code.txt"),
        dict(name="tool-help", value=version, out="version.txt", kept=("tool.py", "usage"),
             files={"tool.py": f"print('usage: tool.py')\nprint('To save the version, run:')\n"
                               f"print('echo', '.'.join(map(str, {tuple(int(x) for x in version.split('.'))})), '> version.txt')\n"},
             text=hinted("tool.py shows how to save its version in version.txt.", "python3 tool.py --help"),
             oracle=f"echo $(python3 tool.py --help | {shown}) > version.txt"),
        dict(name="read-todo", value=w[1], out="done.txt", kept=("TODO", "todo"),
             files={"TODO": f"todo list\n1. save the word. Run this command:\n\n{run_line(w[1], 'done.txt')}\n"},
             text=hinted("The file TODO has one step left to do.", "cat TODO"),
             oracle=f"echo $({shown} TODO) > done.txt"),
        dict(name="count-lines", value=str(n_lines), out="count.txt", kept=("names.txt", names[0]),
             files={"names.txt": "".join(f"{x}\n" for x in names)},
             text=instruction("Count the lines of names.txt and save the number in count.txt.",
                              "wc -l names.txt", "echo NUMBER > count.txt", "NUMBER"),
             oracle="echo $(wc -l < names.txt) > count.txt"),
        dict(name="json-port", value=str(port), out="port.txt", kept=("config.json", "web"),
             files={"config.json": json.dumps({"name": "web", "port": port}) + "\n"},
             text=instruction("config.json sets a port. Save the port number in port.txt.",
                              "cat config.json", "echo PORT > port.txt", "PORT"),
             oracle="python3 -c 'import json; print(json.load(open(\"config.json\"))[\"port\"])' > port.txt"),
    ]


def task_dir(t: dict) -> TaskDir:
    kept_file, kept_text = t["kept"]
    return TaskDir(t["name"], t["files"], t["text"], t["oracle"],
                   check_file(f"    assert state.read_text({t['out']!r}).strip() == {t['value']!r}\n",
                              f"    assert {kept_text!r} in state.read_text({kept_file!r})\n"))


def copies(seen: set[str], seed: int, n: int, label: str = "") -> list[dict]:
    """n instances of every kind, named <kind>-<label><i>, from the first seeds >= `seed` whose
    values are all new (disjoint from `seen`, which grows, and from each other)."""
    out, kinds = [], len(tasks(random.Random(seed)))
    while len(out) < n * kinds:
        drawn = tasks(random.Random(seed))
        values = [t["value"] for t in drawn]
        if len(set(values)) == len(values) and not seen & set(values):
            seen |= set(values)
            copy = len(out) // kinds + 1
            out += [{**t, "name": f"{t['name']}-{label}{copy}", "kind": t["name"]} for t in drawn]
        seed += 1
    return out


def main() -> None:
    train = tasks(random.Random(SEED))
    for t in train:
        write(task_dir(t), HERE, "multiturn", TOML)
        print(f"{t['name']}: {t['value']}")
    seen = {t["value"] for t in train}
    for split, seed, n, label in [("heldout", HELDOUT_SEED, HELDOUT_COPIES, ""), ("train", TRAIN_SEED, TRAIN_COPIES, "t")]:
        shutil.rmtree(HERE / split, ignore_errors=True)
        for t in copies(seen, seed, n, label):
            write(task_dir(t), HERE / split, "multiturn", task_toml("multiturn", TAGS, family=t["kind"]))
            print(f"{split}/{t['name']}: {t['value']}")


if __name__ == "__main__":
    main()
