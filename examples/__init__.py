"""Development-only programs run from a checkout: the demos (`python -m examples.demo`, `make
demo`; `python -m examples.demo_agent`, `make demo-agent`, an agent step on a git repository
killed mid-loop, resumed from its checkpoint and verified) and the stand-in model, a test
double of an OpenAI-compatible API (scripted tool calls included) used by the demos, tests and
bench.

Not part of the installed `tether` distribution: a runner-only install lacks Starlette and
uvicorn, which the stand-in needs.
"""
