"""The dashboard's ASGI app (Starlette): one page, its vendored script and style, and a JSON API
the page polls. Nothing is fetched from outside at run time: the charts are SVG drawn by the
page's own script (``static/dashboard.js``)."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from dockyard.dashboard.run_series import MetricsFollower, RunSeries
from dockyard.dashboard.sources import FleetSource
from dockyard.fleet.dead_letter_pages import MAX_PAGE_SIZE

STATIC = Path(__file__).parent / "static"
DEFAULT_PAGE_SIZE = 20
NO_RUN_DIR = "no run directory: charts need --run-dir (where metrics.jsonl is)"


def _optional_int(request: Request, name: str, default: int | None) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    if not text.isdigit():
        raise ValueError(f"{name}={text!r}: give a whole number")
    return int(text)


def create_app(run_dir: Path | None, fleet: FleetSource) -> Starlette:
    follower = MetricsFollower(run_dir) if run_dir is not None else None

    async def index(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html")

    async def metrics(request: Request) -> JSONResponse:
        if follower is None:
            return JSONResponse(RunSeries(problems=[NO_RUN_DIR]).to_json())
        return JSONResponse(follower.read().to_json())

    async def fleet_view(request: Request) -> JSONResponse:
        return JSONResponse(await fleet.fleet())

    async def dead_letters(request: Request) -> JSONResponse:
        try:
            before = _optional_int(request, "before", None)
            size = _optional_int(request, "size", DEFAULT_PAGE_SIZE) or 0
            if not 1 <= size <= MAX_PAGE_SIZE:
                raise ValueError(f"size={size}: give 1 to {MAX_PAGE_SIZE}")
        except ValueError as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        return JSONResponse(await fleet.dead_letters(before=before, size=size))

    return Starlette(
        routes=[
            Route("/", index),
            Route("/api/metrics", metrics),
            Route("/api/fleet", fleet_view),
            Route("/api/dead-letters", dead_letters),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )
