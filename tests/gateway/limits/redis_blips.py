"""A Redis fault for the limit store's retry tests: a TCP proxy that lets a command run but
loses its reply (a private redis-server to kill and restart is ``tests.support.redis_server``)."""

from __future__ import annotations

import asyncio


class ReplyCutter:
    """A proxy in front of Redis. While ``cut`` is set, the first reply on a connection is
    dropped and that connection aborted: Redis ran the command, the client never hears so."""

    def __init__(self, redis_port: int) -> None:
        self._redis_port = redis_port
        self.cut = False
        self.replies_cut = 0
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"redis://127.0.0.1:{port}/0"

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self._redis_port)

        async def upstream() -> None:
            while data := await client_r.read(65536):
                server_w.write(data)
                await server_w.drain()
            server_w.close()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if self.cut:
                    self.replies_cut += 1
                    client_w.transport.abort()
                    server_w.close()
                    return
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
