#!/usr/bin/python3
"""Generate golden vLLM KV event payloads with real Python msgpack.

Run with Debian's python3 (python3-msgpack):  /usr/bin/python3 gen_golden.py
Writes testdata/golden/<name>.msgpack (the payload) and <name>.json (what the Go decoder
must produce, and under which Encoding, if any, the Go encoder must reproduce the bytes).

vLLM encodes with msgspec (not installed here). msgspec and msgpack-python agree on every
type used: ints in their smallest form (unsigned forms for non-negative values), floats
as float64, str8 for strings longer than 31 bytes, bin for bytes, tuples as arrays. The
layouts below follow vllm/distributed/kv_events.py:
  - up to 0.23 (array_like=True, omit_defaults=True, tag=True): batch [ts, events] or
    [ts, events, dp_rank]; BlockStored [tag, block_hashes, parent_block_hash, token_ids,
    block_size, lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
    kv_cache_spec_sliding_window] with trailing defaults omitted (older versions stop
    after lora_id, medium, lora_name...); BlockRemoved [tag, block_hashes, medium,
    group_idx]; AllBlocksCleared [tag].
  - since mid-2026 (maps, omit_defaults=True): {"type": tag, field: value...} in
    declaration order, optional fields omitted when None; batch {ts, events,
    data_parallel_rank}.
"""
import json
import os
import random

import msgpack

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
M64 = (1 << 64) - 1


def norm_hash(h):
    if isinstance(h, bytes):
        return int.from_bytes(h[-8:], "big")
    return h & M64


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


class Stored:
    def __init__(self, hashes, parent, tokens, block_size=16, lora_id=None, medium=None,
                 lora_name=None, extra_keys=None, group_idx=None, spec_kind=None,
                 sliding_window=None):
        self.f = dict(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                      block_size=block_size, lora_id=lora_id, medium=medium,
                      lora_name=lora_name, extra_keys=extra_keys, group_idx=group_idx,
                      kv_cache_spec_kind=spec_kind,
                      kv_cache_spec_sliding_window=sliding_window)

    ORDER = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
             "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
             "kv_cache_spec_sliding_window"]
    OPTIONAL = 7  # fields from index 7 on have defaults

    def array(self, length=None):
        vals = ["BlockStored"] + [self.f[k] for k in self.ORDER]
        if length is None:  # msgspec: drop trailing defaults
            length = len(vals)
            while length > 1 + self.OPTIONAL and vals[length - 1] is None:
                length -= 1
        return vals[:length]

    def map(self):
        d = {"type": "BlockStored"}
        for i, k in enumerate(self.ORDER):
            if i >= self.OPTIONAL and self.f[k] is None:
                continue
            d[k] = self.f[k]
        return d

    def expect(self):
        f = self.f
        parent = f["parent_block_hash"]
        return {
            "type": "BlockStored",
            "block_hashes": [norm_hash(h) for h in f["block_hashes"]],
            "parent": None if parent in (None, 0) else norm_hash(parent),
            "token_ids": f["token_ids"],
            "block_size": f["block_size"],
            "lora_id": f["lora_id"],
            "medium": f["medium"],
            "lora_name": f["lora_name"],
            "extra_keys_hex": None if f["extra_keys"] is None else pack(f["extra_keys"]).hex(),
            "group_idx": f["group_idx"],
            "spec_kind": f["kv_cache_spec_kind"],
            "sliding_window": f["kv_cache_spec_sliding_window"],
        }


class Removed:
    def __init__(self, hashes, medium=None, group_idx=None):
        self.hashes, self.medium, self.group_idx = hashes, medium, group_idx

    def array(self, length=None):
        vals = ["BlockRemoved", self.hashes, self.medium, self.group_idx]
        if length is None:
            length = 3 if self.group_idx is None else 4
        return vals[:length]

    def map(self):
        d = {"type": "BlockRemoved", "block_hashes": self.hashes, "medium": self.medium}
        if self.group_idx is not None:
            d["group_idx"] = self.group_idx
        return d

    def expect(self):
        return {"type": "BlockRemoved", "block_hashes": [norm_hash(h) for h in self.hashes],
                "medium": self.medium, "group_idx": self.group_idx}


class Cleared:
    def array(self, length=None):
        return ["AllBlocksCleared"]

    def map(self):
        return {"type": "AllBlocksCleared"}

    def expect(self):
        return {"type": "AllBlocksCleared"}


def write(name, obj, ts, events, dp=None, exact=None):
    """events: list of (event, encoded form) or raw dicts for unknown types (skipped)."""
    with open(os.path.join(OUT, name + ".msgpack"), "wb") as f:
        f.write(pack(obj))
    exp = {"ts": ts, "dp_rank": dp, "events": [e.expect() for e in events], "exact": exact}
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)
        f.write("\n")


def toks(n, seed, hi=151936):
    r = random.Random(seed)
    return [r.randrange(hi) for _ in range(n)]


def main():
    os.makedirs(OUT, exist_ok=True)
    ts = 1764412345.678901
    h = [0x12, 200, 60000, 4_000_000_000, (1 << 63) + 5]  # every unsigned width
    s1 = Stored(h[:2], None, toks(32, 1))
    r1 = Removed([h[0]])
    c = Cleared()

    # vLLM <= 0.9-ish: 2-element batch, BlockStored of 6, BlockRemoved of 2.
    evs = [s1, r1, c]
    write("array_v6", [ts, [s1.array(6), r1.array(2), c.array()]], ts, evs)
    # Signed hashes (older vLLM used Python hash()): every signed width.
    sh = [-5, -100, -30000, -2_000_000_000, -(1 << 62), 7]
    s_signed = Stored(sh[:4], -3, toks(64, 2))
    write("array_v6_signed", [ts, [s_signed.array(6), Removed(sh[4:]).array(2)]], ts,
          [s_signed, Removed(sh[4:])])
    # 7: medium; 8: lora_name; with dp rank (3-element batch).
    s7 = Stored(h[2:4], h[1], toks(32, 3), lora_id=None, medium="GPU")
    write("array_v7", [ts, [s7.array(7), Removed(h[2:3], "GPU").array(3)], 0], ts,
          [s7, Removed(h[2:3], "GPU")], dp=0)
    s8 = Stored(h[4:], h[3], toks(16, 4), lora_id=3, medium="GPU", lora_name="sql-adapter")
    write("array_v8", [ts, [s8.array(8)], 2], ts, [s8], dp=2, exact="array")
    # 9: extra_keys (one entry per block, None or a tuple), encoded exactly as msgspec.
    s9 = Stored([11, 12], None, toks(32, 5), medium="GPU",
                extra_keys=[("salt-abc",), None])
    write("array_v9", [ts, [s9.array()], 1], ts, [s9], dp=1, exact="array")
    # 10: group_idx (extra_keys None is kept as nil because a later field is set).
    s10 = Stored([21, 22], 20, toks(32, 6), medium="GPU", group_idx=0)
    r10 = Removed([21], "GPU", group_idx=1)
    write("array_v10", [ts, [s10.array(), r10.array(), c.array()], 0], ts,
          [s10, r10, c], dp=0, exact="array")
    # 12: kv cache spec metadata.
    s12 = Stored([31], 30, toks(16, 7), medium="GPU", lora_name="x" * 40,
                 extra_keys=[("lora-x", ("mm", 3))], group_idx=1,
                 spec_kind="sliding_window", sliding_window=4096)
    write("array_v12", [ts, [s12.array(), c.array()], 0], ts, [s12, c], dp=0,
          exact="array")
    # llm-d-inference-sim style: every optional field nil, 9 elements, parent 0.
    sim = Stored([41, 42], 0, toks(32, 8), lora_id=None, medium=None)
    write("array_sim_nil9", [ts, [sim.array(9)], None], ts, [sim])
    # Unknown event type and extra trailing elements are ignored.
    s_extra = Stored([51], 50, toks(16, 9), medium="GPU")
    write("array_unknown", [ts, [["SomethingNew", 1, 2], s_extra.array(12) + ["future"],
                                 ["AllBlocksCleared", "junk"]], 0, "extra"], ts,
          [s_extra, c], dp=0)

    # Map encoding (vLLM since mid-2026).
    ms = Stored(h[:3], None, toks(48, 10), medium="GPU", lora_name=None)
    mr = Removed(h[:1], "GPU")
    write("map_basic", {"ts": ts, "events": [ms.map(), mr.map(), c.map()],
                        "data_parallel_rank": 0}, ts, [ms, mr, c], dp=0, exact="map")
    mfull = Stored([61, 62], 60, toks(32, 11), lora_id=7, medium="CPU", lora_name="ad",
                   extra_keys=[None, ("salt",)], group_idx=2, spec_kind="full_attention",
                   sliding_window=None)
    write("map_full", {"ts": ts, "events": [mfull.map(), Removed([61], "CPU", 2).map()],
                       "data_parallel_rank": 3}, ts, [mfull, Removed([61], "CPU", 2)],
          dp=3, exact="map")
    # Binary hashes: 32-byte sha256 and 16-byte xxhash digests.
    r = random.Random(12)
    b32 = [bytes(r.randrange(256) for _ in range(32)) for _ in range(3)]
    b16 = [bytes(r.randrange(256) for _ in range(16)) for _ in range(3)]
    sb32 = Stored(b32[1:], b32[0], toks(32, 13), medium="GPU")
    write("map_bin32", {"ts": ts, "events": [sb32.map(), Removed(b32[1:2], "GPU").map()],
                        "data_parallel_rank": 0}, ts, [sb32, Removed(b32[1:2], "GPU")], dp=0)
    sb16 = Stored(b16[1:], b16[0], toks(32, 14), medium="GPU")
    write("array_bin16", [ts, [sb16.array(7), Removed(b16[2:], "GPU").array(3)]], ts,
          [sb16, Removed(b16[2:], "GPU")])
    # Keys out of order, unknown keys, no dp rank, "type" not first.
    d = ms.map()
    odd = {"future_field": {"a": [1, 2.5, None, b"x"]}}
    odd.update({k: v for k, v in reversed(list(d.items()))})
    write("map_unordered", {"events": [odd, {"type": "Mystery", "x": 1}], "ts": ts,
                            "extra": [1, 2]}, ts, [ms])
    # A realistic batch: 20 BlockStored events of 17 blocks (340 blocks), tokens < 65536.
    big, parent = [], None
    rr = random.Random(15)
    for i in range(20):
        hs = [rr.getrandbits(64) for _ in range(17)]
        big.append(Stored(hs, parent, toks(17 * 16, 100 + i, hi=65536), medium="GPU"))
        parent = hs[-1]
    write("map_realistic", {"ts": ts, "events": [e.map() for e in big],
                            "data_parallel_rank": 0}, ts, big, dp=0, exact="map")
    write("array_realistic", [ts, [e.array() for e in big], 0], ts, big, dp=0,
          exact="array")


if __name__ == "__main__":
    main()
