"""Write the held-out split of datasets/learn, heldout/ (run from the repo root: python
datasets/learn/make_tasks.py).

The eight training tasks beside this file are written by hand. The held-out split holds
HELDOUT_COPIES instances of each of their kinds, named <kind>-<i>: the same instruction, the
same checker judge with the training task's check.py, other values (a word, a number, file and
directory names, a function), drawn from seeds HELDOUT_SEED and up. A draw is kept only when its
reference command is none of the training split's and none of an instance kept before, so a
policy that remembered the training commands fails these. The seeds are fixed: running this again writes the same files.
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
HELDOUT_SEED = 2000
HELDOUT_COPIES = 2  # 16 held-out instances for the 8 trained on
KINDS = ["append-line", "cp-backup", "echo-color", "echo-number", "mkdir-out", "mv-rename", "sed-sub", "sed-world"]
WORDS = ["notes", "draft", "final", "report", "todo", "list", "plan", "memo", "summary", "log", "copy", "old"]
COLORS = ["red", "green", "yellow", "purple", "orange", "pink", "brown", "gray", "blue"]
VARS = ["x", "y", "z", "n", "size", "count", "depth", "limit"]
# (function, wrong expression, right expression, an input and its result)
OPS = [("sub", "a + b", "a - b", (5, 3), 2), ("add", "a - b", "a + b", (5, 3), 8),
       ("mul", "a + b", "a * b", (4, 3), 12), ("mod", "a - b", "a % b", (7, 3), 1),
       ("pow", "a + b", "a ** b", (2, 5), 32)]  # plain text on the left: sed reads a regex
# (right word, the typo) for "Hello, <word>!"
TYPOS = [("World", "Wrold"), ("There", "Tehre"), ("Friend", "Freind"), ("Planet", "Palnet"), ("Team", "Taem"),
         ("Python", "Pyhton"), ("Moon", "Mono"), ("Earth", "Eatrh")]

TAGS = ["learn", "shell"]
q = json.dumps  # a string as the training checks spell it: "double-quoted"


def _append_line(rng: random.Random) -> dict:
    v, n = rng.choice(VARS), rng.randrange(2, 100)
    return dict(what=f"Add the line {v} = {n} to the end of config.py.", cmd=f"echo '{v} = {n}' >> config.py",
                files={"config.py": 'name = "app"\n'},
                result=f'    assert state.value("config", {q(v)}) == {n}\n',
                kept='    assert state.value("config", "name") == "app"\n')


def _cp_backup(rng: random.Random) -> dict:
    src, dst = rng.sample(WORDS, 2)
    text = rng.choice(["buy bread", "call mum", "pay rent", "water plants"])
    return dict(what=f"Copy {src}.txt to {dst}.txt.", cmd=f"cp {src}.txt {dst}.txt", files={f"{src}.txt": f"{text}\n"},
                result=f"    assert state.read_text({q(dst + '.txt')}) == {q(text + chr(10))}\n",
                kept=f"    assert state.read_text({q(src + '.txt')}) == {q(text + chr(10))}\n")


def _echo_color(rng: random.Random) -> dict:
    c = rng.choice(COLORS)
    return dict(what=f"Create a file named color.txt that contains the word {c}.", cmd=f"echo {c} > color.txt",
                files={"notes.txt": "colors: " + " ".join(COLORS) + "\n"},
                result=f'    assert state.read_text("color.txt").strip() == {q(c)}\n',
                kept='    assert "colors" in state.read_text("notes.txt")\n')


def _echo_number(rng: random.Random) -> dict:
    n = rng.randrange(2, 100)
    return dict(what=f"Write the number {n} into the file count.txt.", cmd=f"echo {n} > count.txt",
                files={"notes.txt": "count the days of the week\n"},
                result=f'    assert state.read_text("count.txt").strip() == {q(str(n))}\n',
                kept='    assert "week" in state.read_text("notes.txt")\n')


def _mkdir_out(rng: random.Random) -> dict:
    d = rng.choice(WORDS + ["out", "build", "dist", "tmp", "data"])
    return dict(what=f"Create a directory named {d}.", cmd=f"mkdir {d}", files={"README.md": "# project\n"},
                result=f"    assert state.is_dir({q(d)})\n", kept='    assert state.exists("README.md")\n')


def _mv_rename(rng: random.Random) -> dict:
    src, dst = rng.sample(WORDS, 2)
    return dict(what=f"Rename {src}.txt to {dst}.txt.", cmd=f"mv {src}.txt {dst}.txt",
                files={f"{src}.txt": "the report\n", "README.md": "# docs\n"},
                result=f"    assert state.read_text({q(dst + '.txt')}) == {q('the report' + chr(10))} "
                       f"and not state.exists({q(src + '.txt')})\n",
                kept='    assert state.exists("README.md")\n')


def _sed_sub(rng: random.Random) -> dict:
    fn, wrong, right, (a, b), want = rng.choice(OPS)
    other = "mul" if fn != "mul" else "add"
    other_op = "a * b" if other == "mul" else "a + b"
    return dict(what=f"The function {fn} in ops.py computes {wrong} instead of {right}.",
                cmd=f"sed -i 's/{wrong}/{right}/' ops.py", fix_word="Run this command to fix it:",
                files={"ops.py": f"def {fn}(a, b):\n    return {wrong}\n\n\ndef {other}(a, b):\n    return {other_op}\n"},
                result=f'    assert state.call("ops", {q(fn)}, {a}, {b}) == {want}\n',
                kept=f'    assert state.call("ops", {q(other)}, 2, 3) == {6 if other == "mul" else 5}\n')


def _sed_world(rng: random.Random) -> dict:
    right, typo = rng.choice(TYPOS)
    return dict(what=f"msg.py has a typo: it says {typo} instead of {right}.", cmd=f"sed -i 's/{typo}/{right}/' msg.py",
                fix_word="Run this command to fix it:",
                files={"msg.py": f'def msg():\n    return "Hello, {typo}!"\n\n\ndef size():\n    return 3\n'},
                result=f'    assert state.call("msg", "msg") == {q(f"Hello, {right}!")}\n',
                kept='    assert state.call("msg", "size") == 3\n')


# kind -> its draw: what to do, the command, files, and the bodies of check.py's test_result / test_kept
DRAW = {"append-line": _append_line, "cp-backup": _cp_backup, "echo-color": _echo_color, "echo-number": _echo_number,
        "mkdir-out": _mkdir_out, "mv-rename": _mv_rename, "sed-sub": _sed_sub, "sed-world": _sed_world}


def training_commands() -> set[str]:
    """The reference commands of the hand-written training split (the last line of solve.sh)."""
    return {(HERE / k / "solution" / "solve.sh").read_text().strip().splitlines()[-1] for k in KINDS}


def heldout() -> list[dict]:
    seen, out = training_commands(), []
    for kind in KINDS:
        seed = HELDOUT_SEED
        while sum(t["kind"] == kind for t in out) < HELDOUT_COPIES:
            t = DRAW[kind](random.Random(f"{seed}:{kind}"))
            if t["cmd"] not in seen:
                seen.add(t["cmd"])
                out.append({**t, "kind": kind, "name": f"{kind}-{sum(x['kind'] == kind for x in out) + 1}"})
            seed += 1
    return out


def task_dir(t: dict) -> TaskDir:
    instruction = f"{t['what']}\n{t.get('fix_word', 'Run this command:')}\n\n{t['cmd']}\n"
    return TaskDir(t["name"], t["files"], instruction, t["cmd"], check_file(t["result"], t["kept"]))


def main() -> None:
    shutil.rmtree(HERE / "heldout", ignore_errors=True)
    for t in heldout():
        write(task_dir(t), HERE / "heldout", "learn", task_toml("learn", TAGS, family=t["kind"]))
        print(f"heldout/{t['name']}: {t['cmd']}")


if __name__ == "__main__":
    main()
