"""The Prometheus endpoint on the metrics port (``GET /metrics``).

Serves ``REGISTRY``. Nothing is registered on it yet: the nv_inference_* families (read from
the Rust core's statistics at scrape time) and models' custom metrics are issue 5's work.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)


async def _metrics(_request: web.Request) -> web.Response:
    body = generate_latest(REGISTRY)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def start_metrics_server(host: str, port: int) -> web.AppRunner:
    app = web.Application()
    app.router.add_get("/metrics", _metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
