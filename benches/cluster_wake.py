#!/usr/bin/env python3
"""Wake latency of a parked consumer, local vs remote (benches/cluster.sh).

Each round: a consumer long-polls (GET /consume?wait=...) on one node and is given --park-ms to park; then one
produce goes to the owner of the topic's only partition; the time from the produce's answer to the consume's
answer is the wake latency. The consumer is on the owner ("local": the commit wakes it in-process) or on another
node ("remote": the owner signals the parked consumer's node over node RPC, which probes the owner again). Rounds
alternate between the two, so both see the same machine noise. The delivered message is checked (its body names
the round) and acked, untimed, through the consumer's node.

One thread, raw HTTP/1.1 keep-alive sockets and a selector: both answers are timestamped as they complete, with no
thread hand-off in between. Latencies in µs; "answer to answer" can be negative when the consume's answer is read
before the produce's.

    cluster_wake.py --owner URL --other URL --topic T [--rounds 500] [--warmup 20] [--park-ms 30] [--json OUT]
"""

import argparse
import json
import selectors
import socket
import statistics
import sys
import time


class Conn:
    """One keep-alive HTTP/1.1 connection; answers carry Content-Length (berth sends nothing else)."""

    def __init__(self, url):
        hostport = url.removeprefix("http://").rstrip("/")
        host, port = hostport.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.host = hostport
        self.buf = b""

    def send(self, method, path, body=b""):
        head = f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-length: {len(body)}\r\n\r\n"
        self.sock.sendall(head.encode() + body)

    def parse(self):
        """A complete answer at the start of the buffer, removed from it: (status, headers, body); else None."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = self.buf[:end].decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if len(self.buf) < end + 4 + length:
            return None
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        return status, headers, body

    def read_more(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError(f"{self.host} closed the connection")
        self.buf += data

    def answer(self):
        while True:
            got = self.parse()
            if got:
                return got
            self.read_more()


def wait_both(sel, conns, timeout):
    """Reads until every conn in `conns` has an answer; returns {conn: (answer, perf_counter_ns at completion)}."""
    done = {}
    deadline = time.monotonic() + timeout
    for c in conns:  # an answer may already be buffered
        got = c.parse()
        if got:
            done[c] = (got, time.perf_counter_ns())
    while len(done) < len(conns):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer in %.0f s" % timeout)
        for key, _ in sel.select(left):
            c = key.data
            if c in done:
                continue
            c.read_more()
            got = c.parse()
            if got:
                done[c] = (got, time.perf_counter_ns())
    return done


def summary(values):
    if not values:
        return {"n": 0}
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]
    return {
        "n": len(s),
        "min": s[0],
        "p50": statistics.median(s),
        "p90": pick(0.90),
        "p99": pick(0.99),
        "max": s[-1],
        "mean": round(statistics.fmean(s), 1),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--owner", required=True, help="URL of the node that owns the topic's partition")
    ap.add_argument("--other", required=True, help="URL of another node")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--rounds", type=int, default=500, help="timed rounds per side")
    ap.add_argument("--warmup", type=int, default=20, help="untimed rounds per side first")
    ap.add_argument("--park-ms", type=float, default=30.0, help="wait after the consume is sent, before producing")
    ap.add_argument("--wait", default="5s", help="the consume's long-poll budget")
    ap.add_argument("--json")
    a = ap.parse_args()

    producer = Conn(a.owner)
    consumers = {"local": Conn(a.owner), "remote": Conn(a.other)}
    sel = selectors.DefaultSelector()
    for c in [producer, *consumers.values()]:
        sel.register(c.sock, selectors.EVENT_READ, c)
    consume_path = f"/consume?topic={a.topic}&wait={a.wait}&visibility=30s"
    produce_path = f"/produce?topic={a.topic}"
    # Per side: produce answer -> consume answer, produce sent -> consume answer, produce round trip.
    results = {side: {"answer_to_answer_us": [], "send_to_answer_us": [], "produce_rtt_us": []} for side in consumers}
    rounds = 0
    for i in range(2 * (a.warmup + a.rounds)):
        side = "local" if i % 2 == 0 else "remote"
        consumer = consumers[side]
        body = f"wake-{i}".encode()
        consumer.send("GET", consume_path)
        time.sleep(a.park_ms / 1000)
        t0 = time.perf_counter_ns()
        producer.send("POST", produce_path, body)
        done = wait_both(sel, [producer, consumer], timeout=30)
        (p_status, _, p_body), t_p = done[producer]
        (c_status, c_headers, c_body), t_c = done[consumer]
        if p_status != 200:
            sys.exit(f"round {i}: produce answered {p_status}: {p_body!r}")
        if c_status != 200 or c_body != body:
            sys.exit(f"round {i} ({side}): consume answered {c_status} {c_body!r}, expected {body!r}")
        consumer.send("POST", f"/ack?topic={a.topic}&receipt_handle={c_headers['receipt-handle']}")
        ack_status = consumer.answer()[0]
        if ack_status != 200:
            sys.exit(f"round {i} ({side}): ack answered {ack_status}")
        if i >= 2 * a.warmup:
            r = results[side]
            r["answer_to_answer_us"].append((t_c - t_p) / 1000)
            r["send_to_answer_us"].append((t_c - t0) / 1000)
            r["produce_rtt_us"].append((t_p - t0) / 1000)
            rounds += 1
    doc = {
        "owner": a.owner,
        "other": a.other,
        "topic": a.topic,
        "rounds_per_side": a.rounds,
        "park_ms": a.park_ms,
        "sides": {
            side: {
                **{k: summary(v) for k, v in r.items()},
                "negative_answer_to_answer": sum(1 for v in r["answer_to_answer_us"] if v < 0),
                "over_400ms": sum(1 for v in r["send_to_answer_us"] if v > 400_000),
            }
            for side, r in results.items()
        },
    }
    for side, s in doc["sides"].items():
        w = s["answer_to_answer_us"]
        print(
            f"{side:<6} wake (produce answer -> consume answer) µs: p50 {w['p50']:.0f}  p90 {w['p90']:.0f}  "
            f"p99 {w['p99']:.0f}  max {w['max']:.0f}  (n={w['n']}; produce round trip p50 "
            f"{s['produce_rtt_us']['p50']:.0f})"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
