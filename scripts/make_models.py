#!/usr/bin/env python3
"""Writes tiny random-weight llama GGUF models for vigil's tests, using the gguf package.

The tokenizer is borrowed from a vocab-only GGUF shipped in the llama.cpp tree
(models/ggml-vocab-llama-spm.gguf, or ggml-vocab-gpt-2.gguf for an incompatible draft).
Outputs in --out: tiny.gguf, tiny-draft.gguf (same vocab, other weights), random-draft.gguf (same vocab,
a random output head: its drafts are rejected), gpt2-draft.gguf
(gpt-2 vocab: llama-server refuses it as a draft), truncated.gguf, notgguf.gguf.
"""
import argparse
import os

import numpy as np
import gguf


def copy_tokenizer(w, vocab_path):
    r = gguf.GGUFReader(vocab_path)
    n = None
    for name, field in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        val = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            w.add_key_value(name, val, vtype, sub_type=sub)
            if name == "tokenizer.ggml.tokens":
                n = len(val)
        else:
            w.add_key_value(name, val, vtype)
    return n


def write_model(path, vocab_path, seed, layers=2, d=64, heads=2, ff=128, ctx=512, head_scale=None):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("vigil-tiny")
    w.add_context_length(ctx)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d // heads)
    v = copy_tokenizer(w, vocab_path)

    def r(*s):
        return (rng.standard_normal(s) * 0.02).astype(np.float32)

    w.add_tensor("token_embd.weight", r(v, d))
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    if head_scale is not None:
        # an output head of its own: with tied tiny weights every model predicts "repeat the last token"
        w.add_tensor("output.weight", (rng.standard_normal((v, d)) * head_scale).astype(np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        for t in ("attn_norm", "ffn_norm"):
            w.add_tensor(p + t + ".weight", np.ones(d, np.float32))
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + t + ".weight", r(d, d))
        w.add_tensor(p + "ffn_gate.weight", r(ff, d))
        w.add_tensor(p + "ffn_up.weight", r(ff, d))
        w.add_tensor(p + "ffn_down.weight", r(d, ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--gpt2-vocab", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    o = lambda n: os.path.join(a.out, n)  # noqa: E731
    write_model(o("tiny.gguf"), a.vocab, seed=1)
    write_model(o("tiny-draft.gguf"), a.vocab, seed=2, layers=1)
    write_model(o("gpt2-draft.gguf"), a.gpt2_vocab, seed=3, layers=1)
    write_model(o("random-draft.gguf"), a.vocab, seed=5, layers=1, head_scale=1.0)
    data = open(o("tiny.gguf"), "rb").read()
    with open(o("truncated.gguf"), "wb") as f:
        f.write(data[: len(data) - 64 * 1024])
    with open(o("notgguf.gguf"), "wb") as f:
        f.write(b"abcd" + bytes(np.random.default_rng(4).integers(0, 256, 4096, dtype=np.uint8)))
    for n in sorted(os.listdir(a.out)):
        print(f"{n}\t{os.path.getsize(o(n))}")


if __name__ == "__main__":
    main()
