#!/usr/bin/env python3
"""Writes constant-weight llama GGUF models of real shapes for the fit scoring (docs/fit.md).

The weights are a constant (the server's memory does not depend on their values); the tokenizer is the
vocab-only GGUF of the llama.cpp tree. One array is shared by all tensors of a shape, so writing a 14 GB
file needs little memory. Usage: fit_models.py VOCAB_GGUF OUTDIR
"""
import os
import sys

import numpy as np
import gguf

SHAPES = {
    # name: layers, hidden, heads, kv heads, ffn, context (Llama-3-8B and Qwen2.5-1.5B shapes, 32000 vocab)
    "l8b-f16": (32, 4096, 32, 8, 14336, 8192),
    "q15b-f16": (28, 1536, 12, 2, 8960, 32768),
}


# The tokenizer copy is make_models.py's (beside this file; the script's folder is on sys.path).
from make_models import copy_tokenizer  # noqa: E402


def write(path, vocab, layers, d, heads, kv, ff, ctx):
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(os.path.basename(path))
    w.add_context_length(ctx)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d // heads)
    w.add_file_type(1)
    v = copy_tokenizer(w, vocab)
    hd = d // heads
    cache = {}

    def c(*s, dt=np.float16):
        k = (s, dt)
        if k not in cache:
            cache[k] = np.full(s, 0.01, dt)
        return cache[k]

    w.add_tensor("token_embd.weight", c(v, d))
    w.add_tensor("output_norm.weight", c(d, dt=np.float32))
    w.add_tensor("output.weight", c(v, d))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", c(d, dt=np.float32))
        w.add_tensor(p + "ffn_norm.weight", c(d, dt=np.float32))
        w.add_tensor(p + "attn_q.weight", c(d, d))
        w.add_tensor(p + "attn_k.weight", c(kv * hd, d))
        w.add_tensor(p + "attn_v.weight", c(kv * hd, d))
        w.add_tensor(p + "attn_output.weight", c(d, d))
        w.add_tensor(p + "ffn_gate.weight", c(ff, d))
        w.add_tensor(p + "ffn_up.weight", c(ff, d))
        w.add_tensor(p + "ffn_down.weight", c(d, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    vocab, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for name, s in SHAPES.items():
        p = os.path.join(out, name + ".gguf")
        write(p, vocab, *s)
        print(name, os.path.getsize(p), flush=True)
