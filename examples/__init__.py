"""Development-only programs run from a checkout: the demo (`python -m examples.demo`) and the
stand-in model, a test double of an OpenAI-compatible API used by the demo, tests and bench.

Not part of the installed `tether` distribution: a runner-only install lacks Starlette and
uvicorn, which the stand-in needs.
"""
