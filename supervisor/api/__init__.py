"""The supervisor's HTTP API v1: Starlette routes served by uvicorn, each a thin adapter over
the ledger store or a use case (`tether.supervisor.usecases`)."""

from tether.supervisor.api.app import create_app, drain

__all__ = ["create_app", "drain"]
