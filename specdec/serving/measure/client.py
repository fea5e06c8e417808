"""An HTTP client for an SGLang server or `specdec serve`: native /generate and the OpenAI endpoints,
streamed with a clock on every chunk, plus /server_info, /metrics and /flush_cache.

What the answers mean (tau, ITL per token, field names by version) is in records.py.
"""

from __future__ import annotations

import json
import threading
import time

import requests

from specdec.serving.measure.records import MetricsSnapshot, RequestRecord, ServerInfo, record_from_response, record_from_stream


class ClientError(RuntimeError):
    """The server could not be reached or refused the request (one line)."""


class Client:
    """One server at `url`; safe to share between threads (one HTTP session per thread)."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0):
        self.url = url.rstrip("/")
        self.api_key, self.timeout = api_key, timeout
        self._local = threading.local()
        self._model: str | None = None

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    @property
    def session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
            if self.api_key:
                self._local.session.headers["Authorization"] = f"Bearer {self.api_key}"
        return self._local.session

    def request(self, method: str, path: str, timeout: float | None = None, **kw) -> requests.Response:
        try:
            return self.session.request(method, self.url + path, timeout=timeout or self.timeout, **kw)
        except requests.RequestException as exc:
            raise ClientError(f"cannot reach {self.url}{path}: {type(exc).__name__}") from None

    def _json(self, method: str, path: str, **kw) -> dict:
        r = self.request(method, path, **kw)
        if r.status_code != 200:
            raise ClientError(f"{path} answered HTTP {r.status_code}: {r.text.strip()[:200]}")
        return r.json()

    # ----- health and server state
    def health(self) -> bool:
        try:
            return self.request("GET", "/health", timeout=10).status_code == 200
        except ClientError:
            return False

    def server_info(self) -> ServerInfo:
        """/server_info (0.5.10+), falling back to /get_server_info (older versions)."""
        r = self.request("GET", "/server_info", timeout=30)
        if r.status_code == 404:
            r = self.request("GET", "/get_server_info", timeout=30)
        if r.status_code != 200:
            raise ClientError(f"/server_info answered HTTP {r.status_code}: {r.text.strip()[:200]}")
        return ServerInfo.parse(r.json())

    def metrics(self) -> MetricsSnapshot | None:
        """Prometheus /metrics, or None where the server was started without --enable-metrics."""
        r = self.request("GET", "/metrics", timeout=30)
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise ClientError(f"/metrics answered HTTP {r.status_code}")
        return MetricsSnapshot.parse(r.text)

    def flush_cache(self, timeout: float = 60.0) -> bool:
        """Empty the prefix cache and reset the server's acceptance average; SGLang refuses (400) while
        requests run, so retry until `timeout`. False if it never succeeded."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.request("POST", "/flush_cache", timeout=30)
            if r.status_code == 200:
                return True
            if r.status_code != 400 or time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def model_id(self) -> str:
        """The served model's id from /v1/models (OpenAI requests name it)."""
        if self._model is None:
            try:
                self._model = self._json("GET", "/v1/models", timeout=30)["data"][0]["id"]
            except (ClientError, KeyError, IndexError, ValueError):
                self._model = "default"
        return self._model

    # ----- generation
    def generate(self, prompt: str | list[int], max_new_tokens: int = 128, temperature: float = 0.0,
                 stream: bool = True, ignore_eos: bool = False, **sampling) -> RequestRecord:
        """Native /generate with text or token ids; `sampling` goes into sampling_params (top_p, stop, ...)."""
        params = {"max_new_tokens": max_new_tokens, "temperature": temperature, **sampling}
        if ignore_eos:
            params["ignore_eos"] = True
        body = {"input_ids" if isinstance(prompt, list) else "text": prompt, "sampling_params": params, "stream": stream}
        return self._send("generate", "/generate", body)

    def completion(self, prompt: str, max_tokens: int = 128, temperature: float = 0.0, stream: bool = True,
                   ignore_eos: bool = False, **extra) -> RequestRecord:
        """OpenAI /v1/completions (streamed with usage on every chunk and at the end)."""
        body = self._openai_body(max_tokens, temperature, stream, ignore_eos, extra)
        return self._send("completions", "/v1/completions", {**body, "prompt": prompt})

    def chat(self, messages: str | list[dict], max_tokens: int = 128, temperature: float = 0.0, stream: bool = True,
             ignore_eos: bool = False, **extra) -> RequestRecord:
        """OpenAI /v1/chat/completions; a string is one user message."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        body = self._openai_body(max_tokens, temperature, stream, ignore_eos, extra)
        return self._send("chat", "/v1/chat/completions", {**body, "messages": messages})

    def _openai_body(self, max_tokens, temperature, stream, ignore_eos, extra) -> dict:
        body = {"model": self.model_id(), "max_tokens": max_tokens, "temperature": temperature, "stream": stream, **extra}
        if stream:
            # continuous_usage_stats: each chunk carries the cumulative completion_tokens, so that
            # a chunk holding several speculative tokens is counted by the server, not guessed.
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        if ignore_eos:
            body["ignore_eos"] = True
        return body

    def _send(self, kind: str, path: str, body: dict) -> RequestRecord:
        t0 = time.perf_counter()
        r = self.request("POST", path, json=body, stream=body["stream"])
        if r.status_code != 200:
            raise ClientError(f"{path} answered HTTP {r.status_code}: {r.text.strip()[:200]}")
        if not body["stream"]:
            data = r.json()
            return record_from_response(kind, data, time.perf_counter() - t0)
        events, t = [], 0.0
        try:
            for line in r.iter_lines(chunk_size=None):
                t = time.perf_counter() - t0
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                events.append((t, json.loads(payload)))
        except (requests.RequestException, ValueError) as exc:
            raise ClientError(f"{path}: the stream broke off: {type(exc).__name__}: {exc}") from None
        finally:
            r.close()
        try:
            return record_from_stream(kind, events, t)
        except ValueError as exc:
            raise ClientError(f"{path}: {exc}") from None
