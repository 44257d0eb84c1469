"""A local OpenAI-compatible embeddings server for tests, serving real MiniLM vectors.

``POST /v1/embeddings`` answers as OpenAI's API does (float lists, or base64
float32 when the SDK asks for ``encoding_format="base64"``, its default). The
vectors are the packaged MiniLM model's; a model name ending in ``-rev``
returns them with their dimensions in reverse order, a different vector space
with the same cosines, so a test can tell which embedder made a stored vector.
``delay`` slows each request (to interrupt a long job midway); ``requests``
counts them.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
from typing import Any

import numpy as np


class EmbeddingServer:
    """``with EmbeddingServer() as s: openai.OpenAI(base_url=s.url, api_key="x")``."""

    def __init__(self, embedder: Any, delay: float = 0.0):
        self.embedder = embedder
        self.delay = delay
        self.requests = 0
        self.texts = 0
        self._lock = threading.Lock()
        self._httpd: http.server.ThreadingHTTPServer | None = None

    def vectors(self, model: str, texts: list[str]) -> np.ndarray:
        v = np.asarray(self.embedder.embed(texts), dtype=np.float32)
        return v[:, ::-1].copy() if model.endswith("-rev") else v

    def __enter__(self) -> EmbeddingServer:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self.path.rstrip("/") != "/v1/embeddings":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                if server.delay:
                    time.sleep(server.delay)
                with server._lock:
                    server.requests += 1
                    server.texts += len(texts)
                    vecs = server.vectors(body["model"], texts)
                b64 = body.get("encoding_format") == "base64"
                data = [{"object": "embedding", "index": i,
                         "embedding": base64.b64encode(v.tobytes()).decode() if b64 else v.tolist()}
                        for i, v in enumerate(vecs)]
                self._send(200, {"object": "list", "data": data, "model": body["model"],
                                 "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)}})

            def _send(self, status: int, obj: Any) -> None:
                raw = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                try:
                    self.wfile.write(raw)
                except BrokenPipeError:  # the client was killed mid-request (what a crash test does)
                    pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
