"""wharf: train coding agents with reinforcement learning from the trajectories of real CLI agents.

One import package, its rooms side by side (nothing imports upward):

    wharf.core      the shared floor: run config, parquet schema, run-dir layout, processes, models
    wharf.engine    the local engine: vLLM's API on a CPU
    wharf.collect   harbor trials through the recording proxy -> parquet shards + rollouts
    wharf.convert   shards -> training rows -> advantages -> padded micro-batches
    wharf.train     the LoRA trainer (GRPO, SFT) and the adapter's publication
    wharf.pipeline  above the stages: the `wharf` command, loop, eval, replay, report
    wharf.api       the stages as Python functions (docs/api.md)
    wharf/data      what an install carries: the default configs, the bundled demo tasks
"""


def __getattr__(name: str):
    """`wharf.__version__`, read from the install's metadata when asked (`import wharf` stays cheap)."""
    if name != "__version__":
        raise AttributeError(f"module 'wharf' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("wharf")
    except PackageNotFoundError:  # a checkout on sys.path that was never installed
        return "0+unknown"
