"""The server's socket, in a module of its own: `specdec serve` binds it before importing torch and the
app, so a taken port is a one-line error at once rather than after seconds of imports and a model load."""

from __future__ import annotations

import socket


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free one), so the real port is known before serving."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: uvicorn writes a response's head and body separately, and without it
    # the body waits for the client's delayed ACK (40 ms per response on a kept-alive connection).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock
