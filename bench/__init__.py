"""tether's benchmark suite (issue 6): `python -m bench` (full) or `python -m bench --quick`.

One module per measurement; `__main__` runs them in one go on one machine, prints a table and,
when `BENCH_JSON` is set, writes the figures there. Benchmarks print figures; they never pass or
fail. Every process started here is bounded in time, talks only to 127.0.0.1, and is killed in a
`finally`.
"""
