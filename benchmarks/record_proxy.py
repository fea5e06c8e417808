"""A recording reverse proxy: each request's method, path, headers and body are appended to a JSON-lines file,
then it goes on to the upstream server and the answer streams back unchanged. benchmarks/sglang_bench_client.sh
puts it between SGLang's own benchmark client and `specdec serve` to record exactly what that client sends.

usage: python benchmarks/record_proxy.py UPSTREAM_URL PORT OUT.jsonl   (needs aiohttp, as the client does)
"""

from __future__ import annotations

import json
import sys

from aiohttp import ClientSession, ClientTimeout, web

HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "content-encoding", "connection"}


def main(upstream: str, port: int, out: str) -> None:
    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        with open(out, "a") as f:
            f.write(json.dumps({"method": request.method, "path": request.path_qs, "headers": dict(request.headers),
                                "body": body.decode("utf-8", "replace")}) + "\n")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with ClientSession(timeout=ClientTimeout(total=3600)) as session:
            async with session.request(request.method, upstream + request.path_qs, data=body, headers=headers) as r:
                answer = web.StreamResponse(status=r.status, headers={k: v for k, v in r.headers.items()
                                                                      if k.lower() not in HOP_BY_HOP})
                await answer.prepare(request)
                async for chunk in r.content.iter_any():
                    await answer.write(chunk)
                await answer.write_eof()
                return answer

    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", forward)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
