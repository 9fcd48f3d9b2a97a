"""The shared floor of wharf: what more than one stage uses (the run config and its loader, the
run-dir layout, the parquet schema, the process environment, credentials, child processes, the
endpoint client, model loading, the adapter check, processed log-probs, logging, the error base
and the one entry idiom). It imports nothing from the stages (collect, convert, train) or from
the orchestration above them (pipeline)."""
