"""An artifact the tenant may read (a check's log), shown as text inside a page: streamed from
the artifact store in chunks, each decoded as UTF-8 (bad bytes shown as U+FFFD) and escaped,
never sent as the bytes themselves. Who may read a digest is the API's rule
(`artifact_routes.visible_to`)."""

from __future__ import annotations

import codecs
import html
from collections.abc import AsyncIterator

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tether.supervisor.api.artifact_routes import visible_to
from tether.supervisor.api.errors import ApiError
from tether.supervisor.artifacts import InvalidDigest, check_digest
from tether.supervisor.artifacts.port import Artifacts
from tether.supervisor.ledger import Principal
from tether.supervisor.ui import pages, render, session
from tether.supervisor.ui.guard import signed
from tether.wire import ErrorCode


async def escaped(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The bytes of `chunks` as escaped, printable text, a chunk at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    async for chunk in chunks:
        yield html.escape(render.printable(decoder.decode(chunk)), quote=False)
    yield html.escape(render.printable(decoder.decode(b"", final=True)), quote=False)


async def _log(request: Request, who: Principal) -> Response:
    digest: str = request.path_params["digest"]
    store: Artifacts = request.app.state.artifacts
    try:
        check_digest(digest)
    except InvalidDigest as exc:
        raise ApiError(ErrorCode.INVALID_FIELD, f"path: {exc}") from None
    owners = await pages.ledger_of(request).artifact_owners(digest)
    readable = any(visible_to(who.scope, owner) for owner in owners)
    if not readable or await store.size_of(digest) is None:
        raise ApiError(ErrorCode.NOT_FOUND, f"no artifact {digest}")
    head, _, foot = (
        render.templates.get_template("log.html")
        .render(digest=digest, who=who, csrf=session.csrf_token(request), body=Markup("\0"))
        .partition("\0")
    )

    async def body() -> AsyncIterator[str]:
        yield head
        async for text in escaped(store.chunks(digest)):
            yield text
        yield foot

    response = StreamingResponse(body(), media_type="text/html; charset=utf-8")
    response.headers.update(render.HEADERS)
    return response


log = signed(_log)
