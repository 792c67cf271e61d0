#!/usr/bin/env python3
"""`vigil check` on model folders written here (issue #34): time and bytes read for a sharded checkpoint of
about 1 TB whose shards are sparse (real safetensors headers, the data part a hole: no disk blocks), and for
the tiny models of the GPU kit's make_tiny.py (the same tensors, sparse too). Prints a markdown table.

usage: python3 scripts/bench_check.py [--vigil target/release/vigil] [--runs 9] [--dir /tmp/vigil-bench-check]

Each run is a whole `vigil check --json -- vllm serve DIR` (process start, the command line, the configs,
every shard header, the machine checks); `headers ms` and `bytes read` are what check itself reports for the
checkpoint (the `weights` finding's data)."""
import argparse, json, os, shutil, statistics, struct, subprocess, sys, time


def write_st(path, tensors):
    """A safetensors file: 8-byte little-endian header length, the JSON table, the data part as a hole."""
    table, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in tensors:
        n = 2
        for d in shape:
            n *= d
        if dtype == "I64":
            n *= 4
        elif dtype == "BOOL":
            n //= 2
        table[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    head = json.dumps(table, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        f.truncate(8 + len(head) + off)
    return 8 + len(head) + off


def llama(d, name, vocab, hidden, layers, heads, kv, head_dim, ffn, shard_bytes, experts=0, expert_ffn=0):
    """A Llama-layout checkpoint in shards of about shard_bytes, with its index and config; `experts` adds
    MoE-style expert tensors per layer (names only a MoE model has: many tensors, as DeepSeek-V3's 91k)."""
    root = os.path.join(d, name)
    os.makedirs(root, exist_ok=True)
    q, k = heads * head_dim, kv * head_dim
    tensors = [("model.embed_tokens.weight", "BF16", [vocab, hidden]), ("model.norm.weight", "BF16", [hidden]),
               ("lm_head.weight", "BF16", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors += [(p + "input_layernorm.weight", "BF16", [hidden]), (p + "post_attention_layernorm.weight", "BF16", [hidden]),
                    (p + "self_attn.q_proj.weight", "BF16", [q, hidden]), (p + "self_attn.k_proj.weight", "BF16", [k, hidden]),
                    (p + "self_attn.v_proj.weight", "BF16", [k, hidden]), (p + "self_attn.o_proj.weight", "BF16", [hidden, q]),
                    (p + "mlp.gate_proj.weight", "BF16", [ffn, hidden]), (p + "mlp.up_proj.weight", "BF16", [ffn, hidden]),
                    (p + "mlp.down_proj.weight", "BF16", [hidden, ffn])]
        for e in range(experts):
            q_ = f"{p}mlp.experts.{e}."
            tensors += [(q_ + "gate_proj.weight", "BF16", [expert_ffn, hidden]), (q_ + "up_proj.weight", "BF16", [expert_ffn, hidden]),
                        (q_ + "down_proj.weight", "BF16", [hidden, expert_ffn])]
    shards, cur, size = [], [], 0
    for t in tensors:
        n = 2
        for x in t[2]:
            n *= x
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += n
    shards.append(cur)
    weight_map, total = {}, 0
    for i, s in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        total += write_st(os.path.join(root, fn), s)
        for t in s:
            weight_map[t[0]] = fn
    if len(shards) > 1:
        with open(os.path.join(root, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden,
           "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv, "head_dim": head_dim, "max_position_embeddings": 8192,
           "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(cfg, f)
    return root, len(shards), len(tensors), total


def eagle3(d, target_hidden=512):
    root = os.path.join(d, "tiny-eagle3")
    os.makedirs(root, exist_ok=True)
    H, Q, KV, F, DV, V = 512, 512, 256, 1536, 8192, 32000
    t = [("fc.weight", "BF16", [H, 3 * target_hidden]), ("norm.weight", "BF16", [H]), ("lm_head.weight", "BF16", [DV, H]),
         ("midlayer.input_layernorm.weight", "BF16", [H]), ("midlayer.hidden_norm.weight", "BF16", [H]),
         ("midlayer.post_attention_layernorm.weight", "BF16", [H]),
         ("midlayer.self_attn.q_proj.weight", "BF16", [Q, 2 * H]), ("midlayer.self_attn.k_proj.weight", "BF16", [KV, 2 * H]),
         ("midlayer.self_attn.v_proj.weight", "BF16", [KV, 2 * H]), ("midlayer.self_attn.o_proj.weight", "BF16", [H, Q]),
         ("midlayer.mlp.gate_proj.weight", "BF16", [F, H]), ("midlayer.mlp.up_proj.weight", "BF16", [F, H]),
         ("midlayer.mlp.down_proj.weight", "BF16", [H, F]), ("d2t", "I64", [DV]), ("t2d", "BOOL", [V])]
    write_st(os.path.join(root, "model.safetensors"), t)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "vocab_size": V, "hidden_size": H,
           "intermediate_size": F, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 128, "max_position_embeddings": 8192, "draft_vocab_size": DV, "target_hidden_size": H,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(cfg, f)
    return root


def run(vigil, argv, runs):
    walls, data, hdr = [], [], []
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    for _ in range(runs):
        t = time.perf_counter()
        o = subprocess.run([vigil, "check", "--json", "--"] + argv, capture_output=True, timeout=120, env=env)
        walls.append((time.perf_counter() - t) * 1000)
        rep = json.loads(o.stdout)
        data = [f["data"] for f in rep["findings"] if f["rule"] == "weights" and "bytes_read" in (f.get("data") or {})]
        hdr.append(sum(d["ms"] for d in data))
    return walls, data, hdr, rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vigil", default="target/release/vigil")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--dir", default="/tmp/vigil-bench-check")
    a = ap.parse_args()
    if os.path.exists(a.dir):
        shutil.rmtree(a.dir)
    os.makedirs(a.dir)
    t = time.perf_counter()
    # Llama-3.1-405B's layout with 160 layers: 1.03 TB of bf16 in 5 GB shards.
    big, bshards, btensors, bsize = llama(a.dir, "llama-1tb", 128256, 16384, 160, 128, 8, 128, 53248, 5 * 10**9)
    moe, mshards, mtensors, msize = llama(a.dir, "moe-1tb", 129280, 7168, 61, 128, 128, 56, 18432, 5 * 10**9, 256, 2048)
    write_s = time.perf_counter() - t
    tiny, _, ttensors, tsize = llama(a.dir, "tiny-target", 32000, 512, 4, 4, 2, 128, 1536, 10**12)
    draft = eagle3(a.dir)
    disk = int(subprocess.run(["du", "-sk", a.dir], capture_output=True, text=True).stdout.split()[0])
    print(f"written in {write_s:.1f} s: {(bsize + msize) / 1e12:.2f} TB apparent, {disk} KiB on disk for all models\n")
    spec = json.dumps({"method": "eagle3", "model": draft, "num_speculative_tokens": 3})
    cases = [
        (f"{bsize / 1e12:.2f} TB, {bshards} shards, {btensors} tensors", ["vllm", "serve", big, "--tensor-parallel-size", "8"]),
        (f"{msize / 1e12:.2f} TB MoE-style, {mshards} shards, {mtensors} tensors", ["vllm", "serve", moe, "--tensor-parallel-size", "8"]),
        ("tiny target (make_tiny.py shapes)", ["vllm", "serve", tiny]),
        ("tiny target + EAGLE-3 draft", ["vllm", "serve", tiny, "--speculative-config", spec]),
    ]
    print(f"vigil: {a.vigil}; {a.runs} runs each\n")
    print("| checkpoint | check median ms | check max ms | headers read ms (median) | bytes read | weights GiB |")
    print("|---|---|---|---|---|---|")
    for name, argv in cases:
        walls, data, hdrs, rep = run(a.vigil, argv, a.runs)
        blocking = rep.get("blocking")
        hdr = statistics.median(hdrs)
        read = sum(d["bytes_read"] for d in data)
        gib = sum(d["weight_bytes"] for d in data) / 2**30
        print(f"| {name} | {statistics.median(walls):.1f} | {max(walls):.1f} | {hdr:.1f} | {read:,} | {gib:.1f} |"
              + ("" if blocking == 0 else f" (blocking {blocking}!)"))
    shutil.rmtree(a.dir)


if __name__ == "__main__":
    sys.exit(main())
