"""Peer scripts, run with the peers' own venv (`bench/.peers-venv`), never the project's.

Each script measures one peer doing the same one-step no-op job durably and prints one JSON
document on stdout: `{"peer", "version", "by_concurrency": {C: steps_per_s}, "steps_per_s", ...}`
where `steps_per_s` is the best over the concurrencies tried (the peer at its best).
"""
