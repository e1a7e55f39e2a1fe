"""Slow clients cannot starve the others: deadlines and caps on waitress' own event loop.

waitress closes a connection only after `channel_timeout` seconds without a byte, and
stops accepting at `connection_limit` connections. So 200 sockets each trickling one
header byte a second hold every slot for as long as they trickle, before any request is
read (the token check comes too late): every other client is locked out (slow-loris).

`create_server` builds waitress' TCP server with `GuardedServer` and `GuardedChannel`:

- **Header deadline**: a connection must deliver a request's headers within
  `Limits.header_s` of being ready for it (accepted, or its previous answer done); an idle
  keep-alive connection is ready too, so it is closed after the same time.
- **Body deadline**: the body must follow within `Limits.body_s` of the headers' end.
- **Caps**: at most `Limits.per_address` connections per client address and at most
  `Limits.unfinished` connections server-wide waiting on their client (idle or
  mid-request). A newcomer past a cap is not refused: the connection of that address (or
  of the server) that has waited longest on its client is closed instead. A real client
  sends its request at once and is then being answered, which no cap or deadline cuts;
  a trickler loses its slot. Only when every connection of the address is being answered
  is the newcomer closed.

Deadlines are checked every `cleanup_interval` (1 s) by waitress' maintenance pass, so a
connection may outlive its deadline by up to a second. Timed-out connections are closed
without an answer, as waitress' own timeout does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import MultiSocketServer, TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

HEADER_TIMEOUT_S = 10.0  # a request's headers are a few hundred bytes
BODY_TIMEOUT_S = 30.0  # bodies are at most 1 MiB (callbacks send a few KB)
PER_ADDRESS = 64
UNFINISHED = 128


@dataclass(frozen=True)
class Limits:
    header_s: float = HEADER_TIMEOUT_S
    body_s: float = BODY_TIMEOUT_S
    per_address: int = PER_ADDRESS
    unfinished: int = UNFINISHED


class GuardedChannel(HTTPChannel):
    """A waitress connection that knows since when it has been waiting on its client."""

    server: GuardedServer

    def __init__(self, server: GuardedServer, sock: Any, addr: Any, adj: Adjustments,
                 map: dict[int, Any] | None = None) -> None:
        self.waiting_since = time.monotonic()  # ready for a request since
        self.body_since = 0.0
        self._body_of: Any = None  # the request whose body is being read
        super().__init__(server, sock, addr, adj, map=map)
        server.admit(self)

    def waiting_on_client(self) -> bool:
        """Idle or mid-request: nothing being answered or sent, not closing."""
        return not (self.requests or self.total_outbufs_len or self.will_close
                    or self.close_when_flushed)

    def received(self, data: bytes) -> bool:
        done = super().received(data)
        request = self.request
        if request is not None and request.headers_finished and request is not self._body_of:
            self._body_of, self.body_since = request, time.monotonic()
        return done

    def service(self) -> None:
        super().service()  # in a worker thread: the answer is done, the clock restarts
        self.waiting_since = time.monotonic()

    def late(self, now: float, limits: Limits) -> bool:
        request = self.request
        if request is not None and request is self._body_of and request.headers_finished:
            return now - self.body_since > limits.body_s
        return now - self.waiting_since > limits.header_s


class GuardedServer(TcpWSGIServer):
    channel_class = GuardedChannel
    limits = Limits()

    def admit(self, newcomer: GuardedChannel) -> None:
        """Keep the caps by closing whoever waited longest on its client (see module)."""
        others = [c for c in self.active_channels.values()
                  if isinstance(c, GuardedChannel) and c is not newcomer
                  and not (c.will_close or c.close_when_flushed)]
        # evictable: no request in a worker; those waiting on their client go first
        def order(c: GuardedChannel) -> tuple[bool, float]:
            return (not c.waiting_on_client(), c.waiting_since)

        same = [c for c in others if c.addr[:1] == newcomer.addr[:1]]
        if len(same) >= self.limits.per_address:
            spare = sorted((c for c in same if not c.requests), key=order)
            if not spare:  # every connection of this address is being answered
                newcomer.will_close = True
                return
            for c in spare[:len(same) + 1 - self.limits.per_address]:
                c.will_close = True
        waiting = sorted((c for c in others if c.waiting_on_client()), key=order)
        for c in waiting[:max(0, len(waiting) + 1 - self.limits.unfinished)]:
            c.will_close = True

    def maintenance(self, now: float) -> None:
        super().maintenance(now)  # channel_timeout: no byte at all for that long
        clock = time.monotonic()
        for channel in list(self.active_channels.values()):
            if not isinstance(channel, GuardedChannel):
                continue
            if not channel.waiting_on_client():
                channel.waiting_since = clock  # being answered: not the client's time
            elif channel.late(clock, self.limits):
                channel.will_close = True


def create_server(app: Any, limits: Limits = Limits(),
                  dispatcher: ThreadedTaskDispatcher | None = None, **kw: Any) -> Any:
    """waitress.create_server for TCP listeners, with GuardedServer (and `limits`) and
    `dispatcher` (default waitress' own thread pool)."""
    adj = Adjustments(**kw)
    dispatcher = dispatcher or ThreadedTaskDispatcher()
    dispatcher.set_thread_count(adj.threads)
    socket_map: dict[int, Any] = {}
    guarded = type("GuardedServer", (GuardedServer,), {"limits": limits})
    servers = [guarded(app, socket_map, True, None, dispatcher=dispatcher, adj=adj,
                       sockinfo=info) for info in adj.listen]
    if len(servers) == 1:
        return servers[0]
    return MultiSocketServer(socket_map, adj=adj, dispatcher=dispatcher,
                             effective_listen=[(s.effective_host, s.effective_port)
                                               for s in servers],
                             log_info=servers[0].log_info)
