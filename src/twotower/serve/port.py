"""Whether the service can listen where it was asked to, checked before anything is loaded or announced."""

from __future__ import annotations

import errno
import socket

from twotower.checks import flag, given
from twotower.errors import TwoTowerError


def check_port(host: str, port: int, option: str | None = None) -> None:
    """Bind ``host:port`` once (as uvicorn will, with SO_REUSEADDR) and let it go; a port in use, a privileged port
    or an address this machine does not have is a :class:`TwoTowerError` naming ``host`` / ``port`` as the caller
    knows them (:func:`twotower.checks.option_name`: ``port=`` from Python, ``--port``, or ``option`` when the flag is
    spelt otherwise, on the command line). Port 0 (any free port) always passes."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise TwoTowerError(f"{given('host', host)}: not an address this machine can listen on ({exc.strerror}); "
                            "give an IP address such as 127.0.0.1 or 0.0.0.0") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            where = given("port", port, option)  # port=8000 from Python, --port 8000 on the command line
            if exc.errno == errno.EADDRINUSE:
                raise TwoTowerError(f"{where}: {host}:{port} is already in use (another server?): stop it or choose "
                                    f"another {flag('port', option)}") from None
            if exc.errno == errno.EACCES:
                raise TwoTowerError(f"{where}: not allowed to listen on {host}:{port} (ports below 1024 need "
                                    f"privileges): choose a port of 1024 or more") from None
            raise TwoTowerError(f"{given('host', host)} {where}: cannot listen there ({exc.strerror or exc})") from None
