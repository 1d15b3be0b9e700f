#!/usr/bin/python3
"""A real libzmq peer for kvevents' interop test: publishes vLLM KV event batches.

Run with Debian's python3 (python3-zmq, python3-msgpack). It binds a PUB-side socket and,
optionally, vLLM's replay ROUTER, and emits exactly vLLM's frames: [topic, 8-byte
big-endian seq, msgpack payload], seq starting at 0 in every process (so a second run on
the same port is a publisher restart). Replies to replay requests ["", 8-byte start] with
one message per buffered batch, ["", seq, payload] (or ["", topic, seq, payload] with
--replay-topic, vLLM >= 0.26), then END (seq 0xFF x 8, empty payload). The ROUTER keeps
libzmq's default send high-water mark (1,000) like vLLM's, so long replays get truncated.

With --connect the PUB socket connects to --pub instead of binding it, as vLLM's does when
its endpoint has no "*" (kvrouter's central mode: --pub "tcp://SRC_IP:0;127.0.0.1:PORT"
sets the source address too, and --topic "kv@SRC_IP:8000@model" names the pod).

Injected faults: --drop seqs are never sent live (but are buffered for replay), --garble
seqs are sent (and buffered) as garbage.

With --wait-sub-after K the socket is an XPUB, so publishing can hold before batch K until
a subscription arrives (printing "waiting" first; the data frames on the wire are the same
as a PUB's); otherwise it is a PUB, as vLLM's. With --wait-replay as well, it then holds
until it has answered one replay request (the subscriber's rebuild on connect, at most
5 s), so that the faults injected later fall after the rebuild.

After publishing it prints one JSON line: {"holds": {hash: refcount}, "view": {...}} where
holds is the publisher's true cache and view what a correct subscriber must end with
(holds, unless batches were lost without replay: then the subscriber clears at the next
batch it receives). Hashes are the subscriber's uint64 handles, as decimal strings. It then
keeps serving replay requests until stdin closes.
"""
import argparse
import json
import random
import select
import sys
import time

import msgpack
import zmq

M64 = (1 << 64) - 1
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def handle(h):
    if isinstance(h, bytes):
        return int.from_bytes(h[-8:], "big")
    return h & M64


class Refs:
    def __init__(self):
        self.c = {}

    def store(self, hs):
        for h in hs:
            k = handle(h)
            self.c[k] = self.c.get(k, 0) + 1

    def remove(self, hs):
        for h in hs:
            k = handle(h)
            if self.c.get(k, 0) > 0:
                self.c[k] -= 1
                if self.c[k] == 0:
                    del self.c[k]

    def clear(self):
        self.c = {}

    def apply(self, events):
        for e in events:
            if e[0] == "BlockStored":
                self.store(e[1])
            elif e[0] == "BlockRemoved":
                self.remove(e[1])
            else:
                self.clear()

    def dump(self):
        return {str(k): v for k, v in sorted(self.c.items())}


def encode(events, ts, dp, encoding):
    """events: ("BlockStored", hashes, parent, tokens) | ("BlockRemoved", hashes) |
    ("AllBlocksCleared",), laid out as vLLM's msgspec encoder does."""
    out = []
    for e in events:
        if e[0] == "BlockStored":
            f = [("block_hashes", e[1]), ("parent_block_hash", e[2]), ("token_ids", e[3]),
                 ("block_size", 16), ("lora_id", None), ("medium", "GPU"),
                 ("lora_name", None)]
        elif e[0] == "BlockRemoved":
            f = [("block_hashes", e[1]), ("medium", "GPU")]
        else:
            f = []
        if encoding == "map":
            d = {"type": e[0]}
            d.update(f)
            out.append(d)
        else:
            out.append([e[0]] + [v for _, v in f])
    if encoding == "map":
        return msgpack.packb({"ts": ts, "events": out, "data_parallel_rank": dp},
                             use_bin_type=True)
    return msgpack.packb([ts, out, dp], use_bin_type=True)


class Workload:
    def __init__(self, seed, hash_kind):
        self.r = random.Random(seed)
        self.kind = hash_kind
        self.held = []  # raw hashes held, with repeats (vLLM does not deduplicate)
        self.parent = None

    def new_hash(self):
        r = self.r
        if self.kind == "signed":
            return r.randrange(-(1 << 63), 1 << 63)
        if self.kind == "bin32":
            return bytes(r.randrange(256) for _ in range(32))
        if self.kind == "bin16":
            return bytes(r.randrange(256) for _ in range(16))
        return r.getrandbits(64)

    def batch(self, i, clear_at):
        r = self.r
        if i == clear_at:
            self.held, self.parent = [], None
            return [("AllBlocksCleared",)]
        events = []
        for _ in range(r.randint(1, 3)):
            if self.held and r.random() < 0.35:
                h = self.held.pop(r.randrange(len(self.held)))
                events.append(("BlockRemoved", [h]))
                continue
            n = r.randint(1, 4)
            hs = [self.new_hash() for _ in range(n)]
            if self.held and r.random() < 0.2:
                hs[0] = r.choice(self.held)  # a duplicate store of a held block
            tokens = [r.randrange(151936) for _ in range(16 * n)]
            parent = self.parent if r.random() < 0.7 else None
            events.append(("BlockStored", hs, parent, tokens))
            self.held.extend(hs)
            self.parent = hs[-1]
        return events


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pub", required=True)
    ap.add_argument("--connect", action="store_true", help="connect --pub instead of binding it")
    ap.add_argument("--replay")
    ap.add_argument("--replay-topic", action="store_true")
    ap.add_argument("--replay-hwm", type=int, default=0, help="0: libzmq's default, as vLLM")
    ap.add_argument("--replay-sndbuf", type=int, default=0)
    ap.add_argument("--topic", default="")
    ap.add_argument("--encoding", choices=["array", "map"], default="array")
    ap.add_argument("--hash", choices=["int", "signed", "bin32", "bin16"], default="int")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--first-seq", type=int, default=0,
                    help="sequence number of the first batch (a restart that continues the old sequence)")
    ap.add_argument("--dp", type=int, default=0)
    ap.add_argument("--drop", default="")
    ap.add_argument("--garble", default="")
    ap.add_argument("--clear-at", type=int, default=-1)
    ap.add_argument("--interval", type=float, default=0.002)
    ap.add_argument("--wait-sub-after", type=int, default=-1)
    ap.add_argument("--wait-replay", action="store_true")
    a = ap.parse_args()
    drops = {int(x) for x in a.drop.split(",") if x}
    garbled = {int(x) for x in a.garble.split(",") if x}

    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.XPUB if a.wait_sub_after >= 0 else zmq.PUB)
    pub.set_hwm(100_000)
    if a.connect:
        pub.connect(a.pub)
    else:
        pub.bind(a.pub)
    router = None
    if a.replay:
        router = ctx.socket(zmq.ROUTER)
        if a.replay_hwm:
            router.setsockopt(zmq.SNDHWM, a.replay_hwm)
        if a.replay_sndbuf:
            router.setsockopt(zmq.SNDBUF, a.replay_sndbuf)
        router.bind(a.replay)
    topic = a.topic.encode()
    buffer = []  # (seq, payload), vLLM keeps the last 10,000

    served = [0]

    def serve_replay():
        while router is not None and router.poll(0):
            frames = router.recv_multipart()
            if len(frames) != 3:
                continue
            ident, _, start = frames
            start = int.from_bytes(start, "big")
            for seq, payload in buffer:
                if seq >= start:
                    head = [ident, b"", topic] if a.replay_topic else [ident, b""]
                    router.send_multipart(head + [seq.to_bytes(8, "big"), payload])
            head = [ident, b"", topic] if a.replay_topic else [ident, b""]
            router.send_multipart(head + [END_SEQ, b""])
            served[0] += 1

    def wait_sub():
        print("waiting", flush=True)
        while True:
            serve_replay()
            if pub.poll(10) and pub.recv()[:1] == b"\x01":
                break
        deadline = time.time() + 5
        while a.wait_replay and router is not None and served[0] == 0 and time.time() < deadline:
            router.poll(10)
            serve_replay()

    work = Workload(a.seed, a.hash)
    holds, view = Refs(), Refs()
    lost = False
    for seq in range(a.first_seq, a.first_seq + a.batches):
        if seq - a.first_seq == a.wait_sub_after:
            wait_sub()
        serve_replay()
        events = work.batch(seq, a.clear_at)
        ts = time.time()
        payload = encode(events, ts, a.dp, a.encoding)
        holds.apply(events)
        if seq in garbled:
            payload = b"\xc1garbage" + payload[:7]
            lost = True  # undecodable live and in replay: the subscriber clears
            view.clear()
        elif seq in drops and router is None:
            lost = True
        else:
            if lost:
                view.clear()
                lost = False
            view.apply(events)
        buffer.append((seq, payload))
        del buffer[:-10_000]
        if seq not in drops:
            pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
        if a.interval:
            time.sleep(a.interval)
    if lost:
        sys.exit("publisher: the last batch must be delivered, or nobody sees the gap")
    print(json.dumps({"holds": holds.dump(), "view": view.dump()}), flush=True)
    while True:
        serve_replay()
        r, _, _ = select.select([sys.stdin], [], [], 0.01)
        if r and not sys.stdin.readline():
            break
    pub.close(linger=0)
    if router is not None:
        router.close(linger=0)


if __name__ == "__main__":
    main()
