#!/usr/bin/python3
"""troupe_client — a small Python client for a Troupe cluster (pyzmq + msgpack).

Speaks the same wire format as the C client (messages/msg.h): one ZeroMQ frame = one msgpack map
{"v": 1, "t": <type number>, "id": <u64>, ...fields by their C struct names}.

    from troupe_client import Client
    with Client("tcp://127.0.0.1:5555") as c:
        for event in c.generate("Hello", max_tokens=32):
            print(event)            # {"type": "token", ...} ... then one "done" or "error"

    python3 tools/troupe_client.py --endpoint tcp://127.0.0.1:5555 submit "Hello" --max-tokens 32
    python3 tools/troupe_client.py --endpoint tcp://127.0.0.1:5556 inspect

Liveness, as in the C library (tools/lib/client.h): ZMTP heartbeats (heartbeat_ivl_s, default 1 s;
heartbeat_timeout_s, default 3 s) and a socket monitor on the connection. When the connection is
lost (the router died, or answered no heartbeat for the timeout), every request in flight on this
Client ends, exactly once, with a synthesized error: code unavailable, retryable, "the connection
to the router ... was lost ...: the request's outcome is unknown". Later replies for those
requests are dropped. ZeroMQ reconnects, so the same Client serves new requests once a router is
back.

Failover, as in the C library: Client("tcp://h:5555,tcp://h:5557") or Client([ep, ep]) (a topology's
endpoints.clients, one a router; TROUPE_ENDPOINT takes the same list) connects to every router.
New requests go to the first until its connection is lost, then to the next one up. When a
router's connection is lost, each of its submits that had no reply yet (it has not streamed) is
sent again, unchanged, to the next router whose connection is up (at most MAX_RESUBMITS times;
counted in requests_retried) and ends there; one that has streamed ends with the error above.

No cluster, as in the C client (troupe-client exits 3): the first send waits at most
connect_timeout_s (default heartbeat_timeout_s, 3 s) for a connection to one of the routers to
complete its handshake, and raises NoClusterError naming the endpoints if none did (nothing
listens there, or a CURVE server refused our key); ZeroMQ would otherwise queue the request for a
connection that never comes, and the caller would wait in silence for the whole timeout_s. Once a
connection has been made the check is not made again (a router that dies later is the lost
connection above). The command line exits 3 with the message.
"""
import argparse
import json
import os
import random
import sys
import time

import msgpack
import zmq

VERSION = 1
# Wire numbers of messages/msg.h's msg_type_t (append-only there).
TYPES = ["none", "ready", "term", "heartbeat", "stats", "submit", "token", "done", "error", "cancel",
         "prefill_request", "handoff", "kv_announce", "kv_ack", "cache_lookup", "cache_lookup_reply",
         "cache_put", "cache_evict", "cache_pin", "cache_unpin", "cache_fetch", "cache_fetch_reply",
         "cache_event", "expert_load", "expert_placement", "draft_policy", "spec_report", "inspect",
         "inspect_reply", "kv_link"]
TYPE_NUM = {name: i for i, name in enumerate(TYPES)}
ERROR_CODES = ["bad_request", "malformed", "overloaded", "unavailable", "timeout", "cancelled",
               "transfer_failed", "worker_lost", "internal"]
FINISH = ["stop", "length", "cancelled"]
CHAT_ROLES = {"system": 0, "user": 1, "assistant": 2, "tool": 3}
ROLES = ["none", "supervisor", "router", "prefill", "decode", "cache_manager", "expert_balancer",
         "draft_scheduler", "monitor", "client"]
STATES = ["starting", "ready", "draining", "stopping"]


class NoClusterError(ConnectionError):
    """No connection to any of the routers within connect_timeout_s: the cluster is not running,
    the endpoint is not its client endpoint, or a CURVE server refused our key."""


class TroupeError(Exception):
    """The cluster answered with an error message."""

    def __init__(self, reply):
        self.reply = reply
        self.code = reply.get("code_name")
        self.retryable = reply.get("retryable", False)
        super().__init__(f"{self.code}: {reply.get('message')}")


def parse_duration(s):
    """'300' / '90s' / '5m' / '1h' / '2d' -> seconds."""
    s = str(s).strip()
    mul = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(s[-1:], None)
    n = int(s[:-1] if mul else s)
    if n < 0:
        raise ValueError(f"negative duration {s!r}")
    return n * (mul or 1)


def cached_by_source(usage):
    """Where a done message's cached prompt tokens came from: {"device": n, "host": n, "disk": n}
    (the worker's own KV pool, the cache-manager's memory, its disk tier), adding up to
    usage["cached_tokens"]; None when the cluster did not split it (a build before the split)."""
    split = {k: usage.get(f"cached_{k}_tokens", 0) for k in ("device", "host", "disk")}
    return split if sum(split.values()) == usage.get("cached_tokens", 0) else None


def _decorate(m):
    """Adds readable names next to enum numbers."""
    m["type"] = TYPES[m["t"]] if 0 <= m.get("t", -1) < len(TYPES) else "?"
    if m["type"] == "error" and "code" in m:
        m["code_name"] = ERROR_CODES[m["code"]] if m["code"] < len(ERROR_CODES) else "?"
    if m["type"] == "done":
        m["finish_name"] = FINISH[m.get("finish", 0)]
    return m


TERMINAL = ("done", "error", "inspect_reply")
MAX_LOST_IDS = 65536   # ids remembered as lost (their late replies dropped), then forgotten
MAX_RESUBMITS = 3      # a request that has not streamed moves to another router at most this often


class _Link:
    """One router's connection: a DEALER, its socket monitor, its state."""

    def __init__(self, ctx, endpoint, server_key, key, heartbeat_ivl_s, heartbeat_timeout_s):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 100)
        self.sock.setsockopt(zmq.MAXMSGSIZE, 16 << 20)
        if heartbeat_ivl_s:
            to_ms = int(heartbeat_timeout_s * 1000)
            self.sock.setsockopt(zmq.HEARTBEAT_IVL, int(heartbeat_ivl_s * 1000))
            self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, to_ms)
            # The router's side drops our connection likewise when it stops hearing from us.
            self.sock.setsockopt(zmq.HEARTBEAT_TTL, min(to_ms, 6553500))
            why = f"closed, or no heartbeat answered for {to_ms} ms"
        else:
            why = "closed"
        self.lost_message = (f"the connection to the router at {endpoint} was lost ({why}): "
                             "the request's outcome is unknown; retry it")
        # Only a connection that completed its handshake counts: a refused one (a wrong or missing
        # CURVE key) delivered nothing, and its requests stay queued for a later connection.
        self.mon = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        self.connected = False    # a connection completed its handshake and has not dropped since
        self.ever = False         # a connection completed its handshake, now or before (Client.wait_connected)
        self.dropped = False      # a disconnection seen: move or fail its requests once sock is drained
        if server_key:
            if not key:
                raise ValueError("a CURVE server key needs our own keypair too (key=PREFIX)")
            read = lambda path: open(path).read().split()[0].encode()
            self.sock.curve_serverkey = read(server_key)
            self.sock.curve_publickey = read(key + ".pub")
            self.sock.curve_secretkey = read(key + ".key")
        self.sock.connect(endpoint)

    def read_monitor(self):
        while self.mon.poll(0):
            frames = self.mon.recv_multipart()
            event = int.from_bytes(frames[0][:2], "little")
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = self.ever = True
            elif event == zmq.EVENT_DISCONNECTED and self.connected:
                self.connected, self.dropped = False, True

    def close(self):
        if self.mon is not None:
            self.sock.disable_monitor()
            self.mon.close(linger=0)
            self.mon = None
        self.sock.close()


class Client:
    def __init__(self, endpoint, timeout_s=120.0, server_key=None, key=None, max_frame=16 << 20,
                 heartbeat_ivl_s=1.0, heartbeat_timeout_s=3.0, connect_timeout_s=None):
        """endpoint: a router's client endpoint, or several (a list, or comma-separated: the
        topology's endpoints.clients) to fail over between; server_key: the cluster's CURVE public key file; key: our keypair's prefix (key.pub and
        key.key, as troupe-keygen writes them); max_frame: the cluster's limits.max_message_bytes;
        heartbeat_ivl_s: a ZMTP PING this often (0 or None: none, so only a closed connection is
        noticed); heartbeat_timeout_s: no traffic that long after a PING and the connection is lost;
        connect_timeout_s: how long the first send waits for a connection before it raises
        NoClusterError (None: heartbeat_timeout_s, or 3 s without heartbeats; at most timeout_s;
        0: no wait, a request is queued until a router comes, as ZeroMQ does)."""
        self.ctx = zmq.Context.instance()
        endpoints = endpoint.split(",") if isinstance(endpoint, str) else list(endpoint)
        self.links = [_Link(self.ctx, ep.strip(), server_key, key, heartbeat_ivl_s, heartbeat_timeout_s)
                      for ep in endpoints]
        self.active = 0           # where new requests go (the first router, until it is lost)
        self.max_frame = max_frame
        # id -> [link, replied, moves, frame]: sent and not ended yet (no done / error / inspect_reply);
        # frame (the submit as sent, several routers only) for a resubmission.
        self.inflight = {}
        self.lost = set()         # ids ended by the synthesized error: their late replies are dropped
        self.moved = {}           # id -> the links it was moved away from: their replies for it are dropped
        self.pending = []         # (id, message) of lost requests whose error recv has yet to return
        self.requests_lost = self.connections_lost = self.requests_retried = 0
        self.timeout_s = timeout_s
        if connect_timeout_s is None:
            connect_timeout_s = heartbeat_timeout_s if heartbeat_ivl_s and heartbeat_timeout_s else 3.0
        self.connect_timeout_s = min(connect_timeout_s, timeout_s)
        self.endpoints = ",".join(ep.strip() for ep in endpoints)
        self.curve = bool(server_key)
        self.next_id = random.getrandbits(62)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for link in self.links:
            link.close()

    def wait_connected(self, timeout_s):
        """True once a connection to one of the routers has completed its handshake (now or
        before); False when none did within timeout_s. A request sent meanwhile is not lost:
        ZeroMQ queues it for the connection."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        poller = zmq.Poller()
        for link in self.links:
            poller.register(link.mon, zmq.POLLIN)
        while True:
            for link in self.links:
                link.read_monitor()
            if any(link.ever for link in self.links):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(max(1, int(left * 1000)))

    def _check_connected(self, type_name):
        """Raises NoClusterError when no connection completes within connect_timeout_s (until one
        first has: later losses are the lost connection's error). type_name: what is being sent
        (an inspect goes to the monitor's endpoint)."""
        if not self.connect_timeout_s or any(link.ever for link in self.links):
            return
        if not self.wait_connected(self.connect_timeout_s):
            who, key = ("monitor", "inspection endpoint (endpoints.inspect)") if type_name == "inspect" \
                else ("router", "client endpoint (endpoints.client)")
            raise NoClusterError(
                f"no connection to the {who} at {self.endpoints} within {int(self.connect_timeout_s * 1000)} ms: "
                f"is the cluster running, and is that its {key}?"
                + (" (or its CURVE allow-list lacks our key)" if self.curve else ""))

    def _other_link(self, not_k):
        """Another router than not_k whose connection is up, the next in order; None if none."""
        n = len(self.links)
        for d in range(1, n):
            j = (not_k + d) % n
            if self.links[j].connected and not self.links[j].dropped:
                return j
        return None

    def send(self, type_name, id=None, **fields):
        if id is None:
            self.next_id += 1
            id = self.next_id
        m = {"v": VERSION, "t": TYPE_NUM[type_name], "id": id}
        m.update({k: v for k, v in fields.items() if v is not None})
        frame = msgpack.packb(m, use_bin_type=True)
        if len(frame) > self.max_frame:
            raise ValueError("a %s of %d bytes exceeds the cluster's limits.max_message_bytes (%d)"
                             % (type_name, len(frame), self.max_frame))
        self._check_connected(type_name)
        for link in self.links:
            link.read_monitor()
        if self.links[self.active].dropped:   # seen lost (not while it is still being made)
            j = self._other_link(self.active)
            if j is not None:
                self.active = j
        k = self.active
        if type_name == "cancel":   # to the router that has it; not a request of its own
            if id in self.inflight:
                k = self.inflight[id][0]
        else:
            keep = frame if type_name == "submit" and len(self.links) > 1 else None
            self.inflight[id] = [k, False, 0, keep]
        self.links[k].sock.send(frame)
        return id

    def _lose_link(self, k):
        """Link k's connection is gone: its requests with no reply yet move to another router
        whose connection is up; every other gets its error (its router is dead, or a new
        connection has another routing id and gets none of its replies)."""
        link = self.links[k]
        link.dropped = False
        self.connections_lost += 1
        if len(self.lost) + len(self.inflight) > MAX_LOST_IDS:
            self.lost.clear()
            self.moved.clear()
        to = self._other_link(k)
        if to is not None and self.active == k:
            self.active = to
        for rid in sorted(r for r, q in self.inflight.items() if q[0] == k):
            q = self.inflight[rid]
            if to is not None and q[3] is not None and not q[1] and q[2] < MAX_RESUBMITS:
                try:
                    self.links[to].sock.send(q[3], zmq.NOBLOCK)
                    left = self.moved.setdefault(rid, set())
                    left.add(k)
                    left.discard(to)   # moved back to a router it had left: its replies end it there
                    q[0], q[2] = to, q[2] + 1
                    self.requests_retried += 1
                    continue
                except zmq.Again:
                    pass
            del self.inflight[rid]
            self.pending.append((rid, link.lost_message))
            self.lost.add(rid)

    def recv(self, timeout_s=None):
        """The next message (decorated), the synthesized error of a request lost with the
        connection, or None when nothing came within the timeout."""
        t = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + t
        poller = zmq.Poller()
        for link in self.links:
            poller.register(link.sock, zmq.POLLIN)
            poller.register(link.mon, zmq.POLLIN)
        while True:
            # What a router sent before its connection dropped is read first (a done that made it
            # is the request's real outcome); then its requests still in flight move or fail.
            for k, link in enumerate(self.links):
                if link.dropped and not link.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    self._lose_link(k)
            if self.pending:
                self.requests_lost += 1
                rid, message = self.pending.pop(0)
                return {"v": VERSION, "t": TYPE_NUM["error"], "type": "error", "id": rid,
                        "code": ERROR_CODES.index("unavailable"), "code_name": "unavailable",
                        "retryable": True, "message": message}
            left = deadline - time.monotonic()
            ready = dict(poller.poll(max(0, int(left * 1000))))
            for link in self.links:
                if link.mon in ready:
                    link.read_monitor()
            frm = next((k for k, link in enumerate(self.links) if link.sock in ready), None)
            if frm is None:
                if any(link.dropped for link in self.links):
                    continue
                if left <= 0 or not ready:
                    return None
                continue
            try:
                frame = self.links[frm].sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                continue
            m = _decorate(msgpack.unpackb(frame, raw=False, strict_map_key=False))
            rid = m.get("id")
            if rid in self.lost:   # it already ended here: a late reply
                continue
            if frm in self.moved.get(rid, ()):   # from a router it was moved away from (one only
                continue                         # stopped may resume and stream it after it ended)
            q = self.inflight.get(rid)
            if q is not None and q[0] != frm:   # from a router the request has left
                continue
            if q is not None:
                q[1] = True
            if m["type"] in TERMINAL:
                self.inflight.pop(rid, None)
            return m

    def generate(self, prompt=None, messages=None, tokens=None, max_tokens=256, temperature=None,
                 top_k=None, top_p=None, min_p=None, seed=None, stop=None, ignore_eos=None,
                 prompt_cache_key=None, cache_retention=None, tenant=None, stream=True):
        """Yields every reply for one request: token events, then exactly one done or error.
        stream=False: no token events; the done carries the whole completion ("tokens", "text")."""
        sampling = {"max_tokens": max_tokens}
        for k, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                     ("min_p", min_p), ("seed", seed), ("stop", stop), ("ignore_eos", ignore_eos)):
            if v is not None:
                sampling[k] = v
        if messages is not None:
            messages = [{"role": CHAT_ROLES[m["role"]], "content": m["content"]} for m in messages]
        rid = self.send("submit", prompt=prompt, messages=messages, tokens=tokens, sampling=sampling,
                        stream=stream, prompt_cache_key=prompt_cache_key,
                        cache_retention_s=parse_duration(cache_retention) if cache_retention else None,
                        tenant=tenant)
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no terminal reply for request {rid} in {self.timeout_s} s")
            m = self.recv(left)
            if m is None or m.get("id") != rid:
                continue
            yield m
            if m["type"] in ("done", "error"):
                return

    def complete(self, prompt, **kw):
        """The whole text of one request (streamed, or with stream=False from its done), or raises
        TroupeError."""
        text = []
        for m in self.generate(prompt, **kw):
            if m["type"] in ("token", "done"):   # a done has text only when the request did not stream
                text.append(m.get("text", ""))
            elif m["type"] == "error":
                raise TroupeError(m)
        return "".join(text)

    def cancel(self, rid):
        self.send("cancel", id=rid)

    def inspect(self):
        rid = self.send("inspect", what=0)
        while True:
            m = self.recv()
            if m is None:
                raise TimeoutError("monitor did not answer")
            if m.get("id") == rid:
                return m


def main(argv=None):
    ap = argparse.ArgumentParser(description="Troupe Python client")
    ap.add_argument("--endpoint", default=os.environ.get("TROUPE_ENDPOINT", "tcp://127.0.0.1:5555"))
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--server-key", default=os.environ.get("TROUPE_CURVE_SERVER_KEY"),
                    help="the cluster's CURVE public key file")
    ap.add_argument("--key", default=os.environ.get("TROUPE_CURVE_KEY"),
                    help="our CURVE keypair's prefix (PREFIX.pub, PREFIX.key; see troupe-keygen)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("submit")
    s.add_argument("text")
    s.add_argument("--chat", action="store_true")
    s.add_argument("--max-tokens", type=int, default=64)
    s.add_argument("--temperature", type=float)
    s.add_argument("--seed", type=int)
    s.add_argument("--cache-key")
    s.add_argument("--retention")
    s.add_argument("--json", action="store_true")
    s.add_argument("--no-stream", action="store_true",
                   help="no token messages: one final reply (done) carries the whole text")
    sub.add_parser("inspect")
    a = ap.parse_args(argv)
    try:
        return _run(a)
    except NoClusterError as e:
        print(f"troupe_client: {e}", file=sys.stderr)
        return 3
    except TimeoutError as e:   # no terminal reply in time: troupe-client's exit 3 too
        print(f"troupe_client: {e}", file=sys.stderr)
        return 3


def _run(a):
    with Client(a.endpoint, a.timeout, server_key=a.server_key, key=a.key) as c:
        if a.cmd == "inspect":
            print(json.dumps(c.inspect(), default=str))
            return 0
        kw = dict(max_tokens=a.max_tokens, temperature=a.temperature, seed=a.seed,
                  prompt_cache_key=a.cache_key, cache_retention=a.retention, stream=not a.no_stream)
        if a.chat:
            kw["messages"] = [{"role": "user", "content": a.text}]
        else:
            kw["prompt"] = a.text
        rc = 0
        for m in c.generate(**kw):
            if a.json:
                print(json.dumps(m, default=str))
            elif m["type"] == "token":
                print(m.get("text", ""), end="", flush=True)
            elif m["type"] == "done":
                print(m.get("text", ""), end="", flush=True)   # the whole text, with --no-stream
                u = m.get("usage", {})
                src = cached_by_source(u)
                where = f" (cached from {', '.join(f'{k} {v}' for k, v in src.items())})" if src and u["cached_tokens"] else ""
                print(f"\n[done: {m['finish_name']}, usage {u}{where}]", file=sys.stderr)
            elif m["type"] == "error":
                print(f"error {m['code_name']}: {m.get('message')}", file=sys.stderr)
                rc = 1
        return rc


if __name__ == "__main__":
    sys.exit(main())
