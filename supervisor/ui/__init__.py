"""The supervisor's status page at `/ui`: the tenant's tasks and each task live, with the
operator's actions (docs/design.md, Operator API), server-rendered for an operator token kept
in a cookie. `ROUTES` is mounted by the app beside the API's."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from tether.supervisor.ui import actions, live, logs, pages, render


async def _css(_request: Request) -> Response:
    return render.static("ui.css", "text/css; charset=utf-8")


async def _script(_request: Request) -> Response:
    return render.static("live.js", "text/javascript; charset=utf-8")


async def _list_script(_request: Request) -> Response:
    return render.static("list.js", "text/javascript; charset=utf-8")


async def _slash(_request: Request) -> Response:
    return RedirectResponse("/ui", status_code=308)


ROUTES = [
    Route("/ui", pages.tasks, methods=["GET"]),
    Route("/ui/", _slash, methods=["GET"]),
    Route("/ui/tasks-fragment", pages.tasks_fragment, methods=["GET"]),
    Route("/ui/runners", pages.runners, methods=["GET"]),
    Route("/ui/runners-fragment", pages.runners_fragment, methods=["GET"]),
    Route("/ui/login", actions.login_form, methods=["GET"]),
    Route("/ui/login", actions.login, methods=["POST"]),
    Route("/ui/logout", actions.logout, methods=["POST"]),
    Route("/ui/tasks/{task_id}", pages.task, methods=["GET"]),
    Route("/ui/tasks/{task_id}/fragment", pages.fragment, methods=["GET"]),
    Route("/ui/tasks/{task_id}/events", live.events, methods=["GET"]),
    Route("/ui/tasks/{task_id}/approve", actions.approve, methods=["POST"]),
    Route("/ui/tasks/{task_id}/cancel", actions.cancel, methods=["POST"]),
    Route("/ui/tasks/{task_id}/review", actions.review, methods=["POST"]),
    Route("/ui/tasks/{task_id}/gate", actions.open_gate, methods=["POST"]),
    Route("/ui/tasks/{task_id}/happened", actions.happened, methods=["POST"]),
    Route("/ui/artifacts/{digest}", logs.log, methods=["GET"]),
    Route("/ui/static/ui.css", _css, methods=["GET"]),
    Route("/ui/static/live.js", _script, methods=["GET"]),
    Route("/ui/static/list.js", _list_script, methods=["GET"]),
]

__all__ = ["ROUTES"]
