"""convert: stored collect dirs -> token-exact rows -> group advantages -> padded micro-batches.

reader (parquet in, through wharf.schema) -> rows (exact-prefix merge, pure) -> advantages
(pure) -> build (who is used, stats) -> batching (length buckets) -> records (the files train
reads) ; stage.convert_round drives them, `python -m wharf.convert` is its command line.
"""
