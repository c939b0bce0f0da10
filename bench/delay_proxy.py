"""A TCP proxy that delays every byte by a fixed one-way latency in each direction: a
network between the trainer and a reward service, on loopback. (These machines' kernel
has no `netem` qdisc, and no Toxiproxy package is reachable.)

Bytes keep their order; each chunk read is written `one_way_s` after it arrived, so a
request/answer exchange pays 2 x one_way_s on top of the service's own time, and
several connections are delayed independently (a latency, not a bandwidth cap).

    python bench/delay_proxy.py TARGET_PORT ONE_WAY_S --port PORT   # its own process, until killed
"""
from __future__ import annotations

import argparse
import asyncio
import threading


class DelayProxy:
    def __init__(self, target_port: int, one_way_s: float, host: str = "127.0.0.1", port: int = 0):
        self.target = (host, target_port)
        self.one_way_s, self.host = one_way_s, host
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="delay-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> int:
        """Listen on `port` (0: a free one), returned, in a background thread."""
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, self.host, self.port), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def stop(self) -> None:
        async def close():
            self._server.close()
            await self._server.wait_closed()
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "DelayProxy":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w),
                             return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read as bytes come, write each chunk once its latency has passed."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        async def send():
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if data is None:
                    break
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.create_task(send())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((loop.time() + self.one_way_s, data))
        except (ConnectionError, OSError):
            pass
        finally:
            queue.put_nowait((loop.time() + self.one_way_s, None))
            await sender


def main() -> None:
    ap = argparse.ArgumentParser(description="delay every byte between loopback ports")
    ap.add_argument("target_port", type=int)
    ap.add_argument("one_way_s", type=float)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    proxy = DelayProxy(args.target_port, args.one_way_s, port=args.port)
    print(f"delay_proxy listening on {proxy.start()}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
