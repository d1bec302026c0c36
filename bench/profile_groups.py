"""Where the supervisor's CPU goes: own time summed by group (JSON, middleware, auth, logging,
ledger rules, SQLite, the HTTP server, ...), and the functions with the most own and
cumulative time. Two sources give the same summary: py-spy's samples of the thread that holds
the GIL (`from_samples`: the Python work, each sample going to the nearest frame from the leaf
up that a group names; the CPU spent without the GIL is the measured CPU less that) and
cProfile's figures from `bench.profiled` (`from_pstats`: own time on per-thread CPU clocks,
inflated for code that makes many small calls by the profiler's own cost).
"""

from __future__ import annotations

from typing import Any

# (group, what a function's file or name contains); the first group that matches takes it.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SQLite", ("sqlite3", "pysqlite")),
    ("JSON encode/decode", ("msgspec", "json/", "_json.", "tether/codec.py", "tether/wire.py")),
    ("auth", ("supervisor/api/auth.py", "cachetools/")),
    ("logging", ("structlog/", "logging/", "tether/logs.py")),
    ("tracing", ("supervisor/tracing.py", "tether/tracing.py")),
    ("ledger rules (store, writer, rules)", ("supervisor/ledger/",)),
    ("API routes", ("supervisor/api/",)),
    ("middleware", ("starlette/middleware/", "starlette/_exception_handler.py")),
    ("starlette routing, requests, responses", ("starlette/",)),
    ("uvicorn/h11/httptools", ("uvicorn/", "h11/", "httptools")),
    (
        "event loop, sockets, threads (asyncio, anyio)",
        (
            "asyncio/",
            "anyio/",
            "selectors.py",
            "socket",
            "threading.py",
            "queue.py",
            "_thread.",
            "select.epoll",
            "contextvars",
            "concurrent/",
        ),
    ),
)
OTHER = "other"
WITHOUT_GIL = "without the GIL: SQLite's statements and fsyncs, system calls (measured - sampled)"
TOP = 12


def group_of(filename: str, function: str) -> str:
    text = f"{filename}:{function}"
    for group, marks in GROUPS:
        if any(mark in text for mark in marks):
            return group
    return OTHER


def label(filename: str, line: int, function: str) -> str:
    """`module/file.py:line(function)` shortened to the part after site-packages or the root."""
    if filename == "~":
        return function
    for cut in ("site-packages/", "/work/main/", "/lib/python3.11/"):
        if cut in filename:
            filename = filename.split(cut, 1)[1]
            break
    return f"{filename}:{line}({function})"


def _summary(
    source: str,
    groups: dict[str, float],
    own: dict[str, tuple[float, str]],
    cumulative: dict[str, float],
    *,
    ms_per_step: float,
    steps: int,
) -> dict[str, Any]:
    """Shares of the groups' total (in any unit), each also as a part of `ms_per_step`."""
    total = sum(groups.values()) or 1e-9

    def share(v: float) -> dict[str, float]:
        return {"share": v / total, "ms_per_step": ms_per_step * v / total}

    return {
        "profiler": source,
        "steps": steps,
        "ms_per_step": ms_per_step,
        "groups": [
            {"group": g, **share(v)}
            for g, v in sorted(groups.items(), key=lambda kv: kv[1], reverse=True)
        ],
        "top_own": [
            {"function": f, "group": g, **share(v)}
            for f, (v, g) in sorted(own.items(), key=lambda kv: kv[1][0], reverse=True)[:TOP]
        ],
        "top_cumulative_tether": [
            {"function": f, **share(v)}
            for f, v in sorted(cumulative.items(), key=lambda kv: kv[1], reverse=True)[:TOP]
        ],
    }


def from_pstats(
    raw: dict[tuple[str, int, str], tuple[Any, ...]], *, ms_per_step: float, steps: int
) -> dict[str, Any]:
    """From pstats' figures of the window (`bench.profiled.delta`): own and cumulative time."""
    groups: dict[str, float] = {}
    own: dict[str, tuple[float, str]] = {}
    cumulative: dict[str, float] = {}
    for (filename, line, function), entry in raw.items():
        group = group_of(filename, function)
        groups[group] = groups.get(group, 0.0) + entry[2]
        own[label(filename, line, function)] = (entry[2], group)
        if "/supervisor/" in filename or "/tether/" in filename:
            cumulative[label(filename, line, function)] = entry[3]
    return _summary("cProfile", groups, own, cumulative, ms_per_step=ms_per_step, steps=steps)


def from_samples(
    samples: list[tuple[list[str], int]], *, rate_hz: float, ms_per_step: float, steps: int
) -> dict[str, Any]:
    """From py-spy's samples of the thread holding the GIL (`frames root..leaf`, count), taken
    at `rate_hz` while `steps` steps were committed at `ms_per_step` of CPU each: a sample's
    group is that of the nearest frame a group names; its own function is the leaf; every
    tether frame in it counts once towards that frame's cumulative share. The CPU spent
    without the GIL (SQLite's statements and fsyncs, system calls) is the measured CPU less
    the sampled time: its own group."""
    per_sample_ms = 1000 / rate_hz / max(1, steps)  # a sample's time, as ms per step
    groups: dict[str, float] = {}
    own: dict[str, tuple[float, str]] = {}
    cumulative: dict[str, float] = {}
    for frames, count in samples:
        group = next((g for f in reversed(frames) if (g := group_of(f, "")) != OTHER), OTHER)
        ms = count * per_sample_ms
        groups[group] = groups.get(group, 0.0) + ms
        leaf = frames[-1] if frames else "?"
        own[leaf] = (own.get(leaf, (0.0, group))[0] + ms, group)
        for frame in set(frames):
            if "supervisor/" in frame or "tether/" in frame:
                cumulative[frame] = cumulative.get(frame, 0.0) + ms
    groups[WITHOUT_GIL] = max(0.0, ms_per_step - sum(groups.values()))
    return _summary("py-spy --gil", groups, own, cumulative, ms_per_step=ms_per_step, steps=steps)


def lines(summary: dict[str, Any]) -> list[str]:
    """The summary as text for the end of the report."""
    out = [
        f"supervisor profile ({summary['profiler']}; a window of {summary['steps']:,} steps at"
        f" concurrency 64): shares of its CPU, and as parts of {summary['ms_per_step']:.2f} ms"
        " per step (py-spy: measured in its window; cProfile: measured unprofiled)",
        "  by group (own time):",
    ]
    for g in summary["groups"]:
        out.append(f"    {g['share']:6.1%}  {g['ms_per_step']:.3f} ms/step  {g['group']}")
    out.append("  top functions by own time:")
    for f in summary["top_own"]:
        out.append(f"    {f['share']:6.1%}  {f['function']}  [{f['group']}]")
    out.append("  tether's functions by cumulative time:")
    for f in summary["top_cumulative_tether"]:
        out.append(f"    {f['share']:6.1%}  {f['function']}")
    return out
