"""Success rate per toy task: MinimalAgent + the local engine, temperature 1.0, bwrap sandbox.

    .venv/bin/python datasets/toy/measure_success.py ENGINE_URL ATTEMPTS CONCURRENCY [task,task,...]

ENGINE_URL is the engine's root (http://127.0.0.1:PORT, from `python -m collect.engine`).
Prints one line per trial (task, attempt, reward, model calls, stop reason, exception), then a table.
"""
import asyncio, json, sys, time, tempfile
from collections import defaultdict
from pathlib import Path
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

url, attempts, conc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tasks = sorted(p for p in Path("datasets/toy").iterdir() if (p / "task.toml").exists())
if len(sys.argv) > 4: tasks = [t for t in tasks if t.name in sys.argv[4].split(",")]
out = Path(tempfile.mkdtemp(prefix="toy-measure-"))
sem = asyncio.Semaphore(conc)
async def one(task, a):
    cfg = TrialConfig(task=TaskConfig(path=task.resolve()), trial_name=f"{task.name}__{a}", trials_dir=out,
        agent=AgentConfig(import_path="collect.agents.minimal:MinimalAgent", model_name="smollm2-135m",
                          kwargs={"base_url": url + "/v1", "api_key": "k", "temperature": 1.0}),
        environment=EnvironmentConfig(import_path="collect.sandbox.bwrap:BwrapEnvironment"))
    async with sem:
        r = await (await Trial.create(cfg)).run()
    rew = r.verifier_result.rewards["reward"] if r.verifier_result else None
    traj = json.loads((out / cfg.trial_name / "agent" / "trajectory.json").read_text())
    print(task.name, a, rew, traj["n_calls"], traj["stop_reason"], r.exception_info and r.exception_info.exception_type, flush=True)
    return task.name, rew, traj["n_calls"]
async def main():
    t0 = time.time()
    res = await asyncio.gather(*(one(t, a) for a in range(attempts) for t in tasks))
    by = defaultdict(list); calls = 0
    for n, r, c in res: by[n].append(r); calls += c
    print(f"\n| task | successes / attempts |\n|---|---|")
    for n in sorted(by): print(f"| {n} | {sum(1 for r in by[n] if r == 1.0)} / {len(by[n])} |")
    print(f"\n{len(res)} trials, {calls} model calls, {time.time()-t0:.0f} s wall, trials in {out}")
asyncio.run(main())
