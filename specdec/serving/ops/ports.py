"""Ports: one test of whether something listens on a port (a bind, as the servers' own bind goes), and
a free one for a server to take. The launcher, the room and preflight all ask here."""

from __future__ import annotations

import socket


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the system's choice)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on host:port (port_taken's test)."""
    return not port_taken(host, port)


def port_taken(host: str, port: int) -> bool:
    """Something listens on host:port (a bind test, as the server's own bind would go).

    SO_REUSEADDR as uvicorn and SGLang set it: a port a stopped server left in TIME_WAIT is free.
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


__all__ = ["free_port", "port_free", "port_taken"]
