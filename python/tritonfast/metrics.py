"""The Prometheus endpoint on the metrics port (``GET /metrics``).

The nv_inference_* families are read from the Rust core's counters at scrape time by a
collector registered on ``REGISTRY``; this module only serves the registry.
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
