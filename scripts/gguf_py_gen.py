#!/usr/bin/python3
"""Small random-weight GGUF files written the way llama.cpp's converter writes them.

Uses llama.cpp's own gguf-py (GGUFWriter, gguf.quants, the constants), never shoal's writer, so
the files carry what convert_hf_to_gguf.py puts in a real conversion: the keys of
conversion/base.py TextModel.set_gguf_parameters plus each family's class (conversion/qwen.py
Qwen3NextModel / _Qwen35MRopeMixin, conversion/gpt_oss.py GptOssModel, conversion/glm.py
Glm4MoeModel, conversion/gemma.py Gemma3Model), the general.* block of prepare_metadata, and the
tensor types of ModelBase.prepare_tensors: 1-D tensors and *_norm.weight in F32, the router
(ffn_gate_inp, ffn_gate_inp_shexp), ssm_conv1d and anything not ending in .weight (biases, ssm_a)
in F32, the rest at the file type, falling back to F16 where gguf.quants refuses a row length.
gpt-oss's mxfp4 file is what converting the released MXFP4 checkpoint gives: experts in MXFP4
(GptOssModel.repack_mxfp4), the rest at --outtype (F32 here, --rest to change).

Tokenizers: a byte-level BPE ("gpt2") vocabulary of a few hundred tokens learnt from a fixed text
(get_vocab_base: NORMAL tokens, added tokens CONTROL or USER_DEFINED) with its merges, the
pre-tokenizer name each family's checkpoint hashes to in get_vocab_base_pre (qwen35, gpt-4o, glm4),
special ids as SpecialVocab writes them; Gemma 3's sentencepiece ("llama") vocabulary with
scores, byte tokens and types, add_space_prefix false (Gemma3Model.set_vocab).

Weights are tensors in the converter's output layout (after its permutations), drawn from a
seeded numpy generator, so a family/type/seed always gives the same bytes.

usage: gguf_py_gen.py --gguf-py DIR --family F --type f32|q8_0|q4_0|mxfp4 [--seed N] -o FILE
families: qwen35 qwen35moe gpt-oss glm4moe gemma3
"""
import argparse
import os
import re
import sys


def bytes_to_unicode():
    # GPT-2's byte <-> printable-character table (transformers' bytes_to_unicode)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


TEXT = (
    "The quick brown fox jumps over the lazy dog. Hello world! Once upon a time there was a little "
    "girl who lived in a village near the forest. She liked to play in the garden with her friends, "
    "and they would sing songs about the sun, the moon and the stars. What is the capital of France? "
    "The capital of France is Paris. I think that the answer is 42, and 3.14 is pi. "
    "def main(): return 0  # code\n\nUser: tell me a story.\nAssistant: Sure, here is a story about "
    "a cat and a dog who were the best of friends. They ran, jumped and played all day long."
)


def merge_pairs(words, n):
    """Up to n greedy merges of the most frequent adjacent pair ({symbol tuple: count}), ties
    broken by the smallest pair, stopping at pairs seen once."""
    merges = []
    for _ in range(n):
        pairs = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = max(sorted(pairs), key=lambda p: pairs[p])
        if pairs[best] < 2:
            break
        merges.append(best)
        nw = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] = nw.get(tuple(out), 0) + c
        words = nw
    return merges


def learn_bpe(n_merges):
    """Byte-level BPE merges learnt greedily from TEXT (words split at spaces, GPT-2 style)."""
    b2u = bytes_to_unicode()
    words = {}
    for w in re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", TEXT):
        key = tuple(b2u[b] for b in w.encode("utf-8"))
        words[key] = words.get(key, 0) + 1
    return merge_pairs(words, n_merges)


def bpe_vocab(n_merges, added):
    """tokens, types, merges: 256 byte tokens in GPT-2 order, the merged tokens, then the added
    tokens (name, type) as get_vocab_base lays them out."""
    import gguf

    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = learn_bpe(n_merges)
    for a, b in merges:
        if a + b not in tokens:
            tokens.append(a + b)
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for name, t in added:
        tokens.append(name)
        types.append(t)
    return tokens, types, [f"{a} {b}" for a, b in merges]


def spm_vocab(n_pieces):
    """Gemma 3's sentencepiece layout: <pad> <eos> <bos> <unk> <mask>, chat control tokens, the
    258.. byte tokens <0xNN>, then pieces ("▁" for a space) with decreasing scores."""
    import gguf

    tt = gguf.TokenType
    tokens, scores, types = [], [], []

    def add(t, s, ty):
        tokens.append(t)
        scores.append(s)
        types.append(ty)

    for t, ty in (("<pad>", tt.CONTROL), ("<eos>", tt.CONTROL), ("<bos>", tt.CONTROL), ("<unk>", tt.UNKNOWN),
                  ("<mask>", tt.USER_DEFINED), ("[multimodal]", tt.USER_DEFINED), ("<start_of_turn>", tt.USER_DEFINED),
                  ("<end_of_turn>", tt.USER_DEFINED)):
        add(t, 0.0, ty)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, tt.BYTE)
    # pieces: merges learnt on the text with spaces as "▁", scored by merge order
    seen = set(tokens)
    pieces = []
    for ch in sorted(set(TEXT.replace(" ", "▁").replace("\n", ""))):
        pieces.append(ch)
    words = {}
    for w in ("▁" + TEXT.replace("\n", " ")).replace(" ", " ▁").split(" "):
        if w:
            words[tuple(w)] = words.get(tuple(w), 0) + 1
    pieces += [a + b for a, b in merge_pairs(words, n_pieces - len(pieces))]
    # single characters score below every merge; later merges score lower than earlier ones
    n_chars = len(set(TEXT.replace(" ", "▁").replace("\n", "")))
    for i, p in enumerate(pieces):
        if p in seen:
            continue
        seen.add(p)
        s = -1000.0 - i if i < n_chars else -float(i - n_chars)
        add(p, s, tt.NORMAL)
    return tokens, scores, types


class Gen:
    def __init__(self, args):
        import numpy as np
        import gguf

        self.np, self.gguf, self.args = np, gguf, args
        self.rng = np.random.default_rng(args.seed)
        self.tensors = []  # (name, numpy array in the converter's (reversed ggml) shape, force)

    def w(self, name, *shape, scale=None, center=0.0):
        """A weight drawn N(center, scale); shape in numpy (row-major) order as the converter
        holds it: (out, in) for a matrix, which gguf-py writes as ggml ne {in, out}."""
        np = self.np
        if scale is None:
            scale = 1.0 / np.sqrt(shape[-1]) if len(shape) > 1 else 0.1
        a = (self.rng.standard_normal(shape) * scale + center).astype(np.float32)
        self.tensors.append((name, a))
        return a

    def norm(self, name, n):
        # stored with the +1 of (1 + w) RMSNorms already added, as the converters do
        self.w(name, n, scale=0.1, center=1.0)

    def qtype(self, name, data):
        Q = self.gguf.GGMLQuantizationType
        t = self.args.type
        if t == "mxfp4":
            if re.search(r"ffn_(gate|up|down)_exps\.weight$", name):
                return Q.MXFP4
            t = self.args.rest
        n_dims = len(data.shape)
        if n_dims <= 1 or name.endswith("_norm.weight"):
            return Q.F32
        if re.search(r"(ffn_gate_inp|ffn_gate_inp_shexp|ssm_conv1d)\.weight$", name) or not name.endswith(".weight"):
            return Q.F32
        return {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0}[t]

    def write(self, path, arch, kv, vocab):
        gguf, np = self.gguf, self.np
        wr = gguf.GGUFWriter(path, arch)
        for name, data in self.tensors:
            q = self.qtype(name, data)
            try:
                d = gguf.quants.quantize(data, q)
            except gguf.QuantError:
                q = gguf.GGMLQuantizationType.F16
                d = gguf.quants.quantize(data, q)
            wr.add_tensor(name, d, raw_dtype=q)
        ft = gguf.LlamaFileType
        ftype = {"f32": ft.ALL_F32, "q8_0": ft.MOSTLY_Q8_0, "q4_0": ft.MOSTLY_Q4_0, "mxfp4": ft.MOSTLY_MXFP4_MOE}[self.args.type]
        # prepare_metadata: general.type, the model card block, then set_gguf_parameters
        wr.add_type(gguf.GGUFType.MODEL)
        wr.add_name(f"Tiny {arch}")
        wr.add_size_label("tiny")
        for fn, *a in kv:
            getattr(wr, fn)(*a)
        wr.add_file_type(ftype)
        wr.add_quantization_version(gguf.GGML_QUANT_VERSION)
        vocab(wr)
        wr.write_header_to_file()
        wr.write_kv_data_to_file()
        wr.write_tensors_to_file()
        wr.close()


def bpe_writer(gen, pre, added, specials, add_bos=None, template=None, n_merges=200):
    tokens, types, merges = bpe_vocab(n_merges, added)
    ids = {t: i for i, t in enumerate(tokens)}

    def put(wr):
        wr.add_tokenizer_model("gpt2")
        wr.add_tokenizer_pre(pre)
        wr.add_token_list(tokens)
        wr.add_token_types(types)
        wr.add_token_merges(merges)  # SpecialVocab(load_merges=True).add_to_gguf
        for kind, name in specials:
            getattr(wr, f"add_{kind}_token_id")(ids[name])
        if add_bos is not None:
            wr.add_add_bos_token(add_bos)
        if template:
            wr.add_chat_template(template)

    return put, len(tokens)


QWEN_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def gen_qwen35(g, moe):
    import gguf

    tt = gguf.TokenType
    a = g.args
    added = [("<|endoftext|>", tt.CONTROL), ("<|im_start|>", tt.CONTROL), ("<|im_end|>", tt.CONTROL),
             ("<tool_call>", tt.USER_DEFINED), ("</tool_call>", tt.USER_DEFINED), ("<think>", tt.USER_DEFINED),
             ("</think>", tt.USER_DEFINED)]
    # Qwen's config.json names bos_token_id <|endoftext|>; tokenizer_config: eos <|im_end|>,
    # pad <|endoftext|>, add_bos_token false
    vocab, n_vocab = bpe_writer(g, "qwen35", added,
                                [("bos", "<|endoftext|>"), ("eos", "<|im_end|>"), ("pad", "<|endoftext|>")],
                                add_bos=False, template=QWEN_TEMPLATE)
    n_embd, n_layer, n_head, n_kv, hd = 128, 4, 4, 2, 64
    n_ff = 256
    k_heads, v_heads, k_dim, v_dim, conv = 2, 4, 32, 32, 4
    n_exp, n_used, exp_ff, sh_ff = 8, 2, 64, 64
    interval = 4
    arch = "qwen35moe" if moe else "qwen35"
    n_mtp = a.nextn
    kv = [
        ("add_block_count", n_layer + n_mtp),
        ("add_context_length", 262144),
        ("add_embedding_length", n_embd),
    ]
    if not moe:
        kv.append(("add_feed_forward_length", n_ff))
    kv += [
        ("add_head_count", n_head),
        ("add_head_count_kv", n_kv),
        ("add_rope_dimension_sections", [11, 11, 10, 0]),
        ("add_rope_freq_base", 10000000.0),
        ("add_layer_norm_rms_eps", 1e-6),
    ]
    if moe:
        kv += [("add_expert_count", n_exp), ("add_expert_used_count", n_used)]
    kv += [("add_key_length", hd), ("add_value_length", hd)]
    if moe:
        kv += [("add_expert_feed_forward_length", exp_ff), ("add_expert_shared_feed_forward_length", sh_ff)]
    kv += [
        ("add_ssm_conv_kernel", conv),
        ("add_ssm_state_size", k_dim),
        ("add_ssm_group_count", k_heads),
        ("add_ssm_time_step_rank", v_heads),
        ("add_ssm_inner_size", v_dim * v_heads),
        ("add_full_attention_interval", interval),
        ("add_rope_dimension_count", int(hd * 0.25)),
    ]
    if n_mtp:  # _QwenMtpMixin.set_gguf_parameters
        kv.append(("add_nextn_predict_layers", n_mtp))
    # tied: token_embd is the output matrix too, so its rows are kept as small as output's
    g.w("token_embd.weight", n_vocab, n_embd, scale=1.0 / n_embd ** 0.5 if a.tied else 1.0)
    for i in range(n_layer + n_mtp):
        p = f"blk.{i}."
        g.norm(p + "attn_norm.weight", n_embd)
        if (i + 1) % interval != 0 and i < n_layer:
            qk = 2 * k_heads * k_dim + v_heads * v_dim
            g.w(p + "attn_qkv.weight", qk, n_embd)
            g.w(p + "attn_gate.weight", v_heads * v_dim, n_embd)
            g.w(p + "ssm_conv1d.weight", qk, conv, scale=0.5)  # squeezed (channels, 1, k)
            g.w(p + "ssm_dt.bias", v_heads, scale=0.5)
            g.tensors.append((p + "ssm_a", -g.np.exp(g.rng.standard_normal(v_heads).astype(g.np.float32) * 0.5)))
            g.w(p + "ssm_beta.weight", v_heads, n_embd)
            g.w(p + "ssm_alpha.weight", v_heads, n_embd)
            g.w(p + "ssm_norm.weight", v_dim, scale=0.1, center=1.0)  # linear_attn.norm: no +1
            g.w(p + "ssm_out.weight", n_embd, v_heads * v_dim)
        else:
            g.w(p + "attn_q.weight", 2 * n_head * hd, n_embd)  # query and gate per head
            g.w(p + "attn_k.weight", n_kv * hd, n_embd)
            g.w(p + "attn_v.weight", n_kv * hd, n_embd)
            g.w(p + "attn_output.weight", n_embd, n_head * hd)
            g.norm(p + "attn_q_norm.weight", hd)
            g.norm(p + "attn_k_norm.weight", hd)
        g.norm(p + "post_attention_norm.weight", n_embd)
        if moe:
            g.w(p + "ffn_gate_inp.weight", n_exp, n_embd)
            g.w(p + "ffn_gate_exps.weight", n_exp, exp_ff, n_embd)
            g.w(p + "ffn_up_exps.weight", n_exp, exp_ff, n_embd)
            g.w(p + "ffn_down_exps.weight", n_exp, n_embd, exp_ff)
            g.w(p + "ffn_gate_inp_shexp.weight", 1, n_embd)  # Linear(n_embd, 1): 2-D {n_embd, 1}
            g.w(p + "ffn_gate_shexp.weight", sh_ff, n_embd)
            g.w(p + "ffn_up_shexp.weight", sh_ff, n_embd)
            g.w(p + "ffn_down_shexp.weight", n_embd, sh_ff)
        else:
            g.w(p + "ffn_gate.weight", n_ff, n_embd)
            g.w(p + "ffn_up.weight", n_ff, n_embd)
            g.w(p + "ffn_down.weight", n_embd, n_ff)
        if i >= n_layer:
            nextn(g, p, n_embd, n_vocab, False)
    g.norm("output_norm.weight", n_embd)
    if not a.tied:
        g.w("output.weight", n_vocab, n_embd)
    return arch, kv, vocab


def nextn(g, p, n_embd, n_vocab, heads):
    """An MTP block's own tensors (mtp.fc -> eh_proj, pre_fc_norm_* -> enorm/hnorm, norm ->
    shared_head.norm; GLM's checkpoints also carry embed_tokens and shared_head.head)."""
    g.w(p + "nextn.eh_proj.weight", n_embd, 2 * n_embd)
    g.norm(p + "nextn.enorm.weight", n_embd)
    g.norm(p + "nextn.hnorm.weight", n_embd)
    g.norm(p + "nextn.shared_head_norm.weight", n_embd)
    if heads:
        g.w(p + "nextn.embed_tokens.weight", n_vocab, n_embd)
        g.w(p + "nextn.shared_head_head.weight", n_vocab, n_embd)


HARMONY = ("{{- '<|start|>system<|message|>You are ChatGPT.<|end|>' }}{%- for m in messages %}"
           "{{- '<|start|>' + m.role + '<|message|>' + m.content + '<|end|>' }}{%- endfor %}"
           "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}")


def gen_gptoss(g):
    import gguf

    tt = gguf.TokenType
    added = [(t, tt.CONTROL) for t in ("<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>",
                                       "<|return|>", "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>",
                                       "<|end|>", "<|message|>", "<|reserved_200009|>", "<|reserved_200010|>",
                                       "<|reserved_200011|>", "<|call|>")]
    # tokenizer_config of openai/gpt-oss: bos <|startoftext|>, eos <|return|>, pad <|endoftext|>;
    # no add_bos_token entry
    vocab, n_vocab = bpe_writer(g, "gpt-4o", added,
                                [("bos", "<|startoftext|>"), ("eos", "<|return|>"), ("pad", "<|endoftext|>")],
                                template=HARMONY)
    n_embd, n_layer, n_head, n_kv, hd = 128, 4, 4, 2, 64
    n_exp, n_used, n_ff = 4, 2, 64
    kv = [
        ("add_block_count", n_layer),
        ("add_context_length", 131072),
        ("add_embedding_length", n_embd),
        ("add_feed_forward_length", n_ff),
        ("add_head_count", n_head),
        ("add_head_count_kv", n_kv),
        ("add_rope_scaling_type", gguf.RopeScalingType.YARN),
        ("add_rope_scaling_factor", 32.0),
        ("add_rope_scaling_orig_ctx_len", 4096),
        ("add_rope_scaling_yarn_beta_fast", 32.0),
        ("add_rope_scaling_yarn_beta_slow", 1.0),
        ("add_rope_freq_base", 150000.0),
        ("add_layer_norm_rms_eps", 1e-5),
        ("add_expert_count", n_exp),
        ("add_expert_used_count", n_used),
        ("add_key_length", hd),
        ("add_value_length", hd),
        ("add_sliding_window", 128),
        ("add_expert_feed_forward_length", n_ff),
    ]
    g.w("token_embd.weight", n_vocab, n_embd, scale=1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        g.norm(p + "attn_norm.weight", n_embd)
        g.w(p + "attn_q.weight", n_head * hd, n_embd)
        g.w(p + "attn_q.bias", n_head * hd)
        g.w(p + "attn_k.weight", n_kv * hd, n_embd)
        g.w(p + "attn_k.bias", n_kv * hd)
        g.w(p + "attn_v.weight", n_kv * hd, n_embd)
        g.w(p + "attn_v.bias", n_kv * hd)
        g.w(p + "attn_output.weight", n_embd, n_head * hd)
        g.w(p + "attn_output.bias", n_embd)
        g.w(p + "attn_sinks.weight", n_head, scale=1.0)
        g.norm(p + "post_attention_norm.weight", n_embd)
        g.w(p + "ffn_gate_inp.weight", n_exp, n_embd)
        g.w(p + "ffn_gate_inp.bias", n_exp)
        g.w(p + "ffn_gate_exps.weight", n_exp, n_ff, n_embd)
        g.w(p + "ffn_gate_exps.bias", n_exp, n_ff)
        g.w(p + "ffn_up_exps.weight", n_exp, n_ff, n_embd)
        g.w(p + "ffn_up_exps.bias", n_exp, n_ff)
        g.w(p + "ffn_down_exps.weight", n_exp, n_embd, n_ff)
        g.w(p + "ffn_down_exps.bias", n_exp, n_embd)
    g.norm("output_norm.weight", n_embd)
    g.w("output.weight", n_vocab, n_embd)
    return "gpt-oss", kv, vocab


GLM_TEMPLATE = ("[gMASK]<sop>{%- for m in messages %}{{- '<|' + m.role + '|>\\n' + m.content }}{%- endfor %}"
                "{%- if add_generation_prompt %}<|assistant|>{%- endif %}")


def gen_glm4moe(g):
    import gguf

    tt = gguf.TokenType
    added = [("<|endoftext|>", tt.CONTROL), ("[MASK]", tt.CONTROL), ("[gMASK]", tt.CONTROL), ("[sMASK]", tt.CONTROL),
             ("<sop>", tt.CONTROL), ("<eop>", tt.CONTROL), ("<|system|>", tt.CONTROL), ("<|user|>", tt.CONTROL),
             ("<|assistant|>", tt.CONTROL), ("<|observation|>", tt.CONTROL), ("<think>", tt.USER_DEFINED),
             ("</think>", tt.USER_DEFINED), ("<tool_call>", tt.USER_DEFINED), ("</tool_call>", tt.USER_DEFINED)]
    # _set_vocab_glm: bos [gMASK], eot <|user|>, unk <|endoftext|>, eom <|observation|>; SpecialVocab
    # from the checkpoint: eos <|endoftext|>, pad <|endoftext|>
    vocab, n_vocab = bpe_writer(g, "glm4", added,
                                [("eos", "<|endoftext|>"), ("pad", "<|endoftext|>"), ("bos", "[gMASK]"),
                                 ("eot", "<|user|>"), ("unk", "<|endoftext|>"), ("eom", "<|observation|>")],
                                template=GLM_TEMPLATE)
    n_embd, n_layer, n_head, n_kv, hd = 128, 3, 4, 2, 64
    n_ff, n_exp, n_used, exp_ff, n_dense = 256, 8, 2, 64, 1
    n_mtp = g.args.nextn
    kv = [
        ("add_block_count", n_layer + n_mtp),
        ("add_context_length", 131072),
        ("add_embedding_length", n_embd),
        ("add_feed_forward_length", n_ff),
        ("add_head_count", n_head),
        ("add_head_count_kv", n_kv),
        ("add_rope_freq_base", 1000000.0),
        ("add_layer_norm_rms_eps", 1e-5),
        ("add_expert_count", n_exp),
        ("add_expert_used_count", n_used),
        ("add_expert_group_count", 1),
        ("add_expert_group_used_count", 1),
        ("add_key_length", hd),
        ("add_value_length", hd),
        ("add_rope_dimension_count", hd // 2),  # partial_rotary_factor 0.5
        ("add_expert_feed_forward_length", exp_ff),
        ("add_expert_shared_count", 1),
        ("add_leading_dense_block_count", n_dense),
        ("add_expert_gating_func", gguf.ExpertGatingFuncType.SIGMOID),
        ("add_expert_weights_scale", 2.5),
        ("add_expert_weights_norm", True),
        ("add_nextn_predict_layers", n_mtp),
    ]
    g.w("token_embd.weight", n_vocab, n_embd, scale=1.0)
    for i in range(n_layer + n_mtp):
        p = f"blk.{i}."
        g.norm(p + "attn_norm.weight", n_embd)
        g.w(p + "attn_q.weight", n_head * hd, n_embd)
        g.w(p + "attn_q.bias", n_head * hd)
        g.w(p + "attn_k.weight", n_kv * hd, n_embd)
        g.w(p + "attn_k.bias", n_kv * hd)
        g.w(p + "attn_v.weight", n_kv * hd, n_embd)
        g.w(p + "attn_v.bias", n_kv * hd)
        g.w(p + "attn_output.weight", n_embd, n_head * hd)
        if g.args.qk_norm:
            g.norm(p + "attn_q_norm.weight", hd)
            g.norm(p + "attn_k_norm.weight", hd)
        g.norm(p + "post_attention_norm.weight", n_embd)
        if i < n_dense:
            g.w(p + "ffn_gate.weight", n_ff, n_embd)
            g.w(p + "ffn_up.weight", n_ff, n_embd)
            g.w(p + "ffn_down.weight", n_embd, n_ff)
        else:
            g.w(p + "ffn_gate_inp.weight", n_exp, n_embd)
            g.w(p + "exp_probs_b.bias", n_exp, scale=0.1)  # e_score_correction_bias
            g.w(p + "ffn_gate_exps.weight", n_exp, exp_ff, n_embd)
            g.w(p + "ffn_up_exps.weight", n_exp, exp_ff, n_embd)
            g.w(p + "ffn_down_exps.weight", n_exp, n_embd, exp_ff)
            g.w(p + "ffn_gate_shexp.weight", exp_ff, n_embd)
            g.w(p + "ffn_up_shexp.weight", exp_ff, n_embd)
            g.w(p + "ffn_down_shexp.weight", n_embd, exp_ff)
        if i >= n_layer:
            nextn(g, p, n_embd, n_vocab, True)
    g.norm("output_norm.weight", n_embd)
    g.w("output.weight", n_vocab, n_embd)
    return "glm4moe", kv, vocab


GEMMA_TEMPLATE = ("{{ bos_token }}{%- for m in messages %}{{ '<start_of_turn>' + m.role + '\\n' + m.content + "
                  "'<end_of_turn>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{%- endif %}")


def gen_gemma3(g):
    tokens, scores, types = spm_vocab(300)
    n_vocab = len(tokens)

    def vocab(wr):
        wr.add_tokenizer_model("llama")
        wr.add_tokenizer_pre("default")
        wr.add_token_list(tokens)
        wr.add_token_scores(scores)
        wr.add_token_types(types)
        # SpecialVocab: bos <bos>, eos <eos>, unk <unk>, pad <pad>; tokenizer_config add_bos true,
        # add_eos false
        wr.add_bos_token_id(2)
        wr.add_eos_token_id(1)
        wr.add_unk_token_id(3)
        wr.add_pad_token_id(0)
        wr.add_add_bos_token(True)
        wr.add_add_eos_token(False)
        wr.add_chat_template(GEMMA_TEMPLATE)
        wr.add_add_space_prefix(False)

    n_embd, n_layer, n_head, n_kv, hd, n_ff = 128, 7, 4, 2, 64, 256
    kv = [
        ("add_block_count", n_layer),
        ("add_context_length", 32768),
        ("add_embedding_length", n_embd),
        ("add_feed_forward_length", n_ff),
        ("add_head_count", n_head),
        ("add_head_count_kv", n_kv),
        ("add_rope_freq_base", 1000000.0),
        ("add_rope_freq_base_swa", 10000.0),
        ("add_layer_norm_rms_eps", 1e-6),
        ("add_key_length", hd),
        ("add_value_length", hd),
        ("add_sliding_window", 8),
    ]
    if g.args.rope_linear:
        kv.insert(6, ("add_rope_scaling_type", g.gguf.RopeScalingType.LINEAR))
        kv.insert(7, ("add_rope_scaling_factor", 8.0))
    # tied (and scaled by sqrt(n_embd) on input): rows of output's size
    g.w("token_embd.weight", n_vocab, n_embd, scale=1.0 / n_embd ** 0.5)
    for i in range(n_layer):
        p = f"blk.{i}."
        g.norm(p + "attn_norm.weight", n_embd)
        g.w(p + "attn_q.weight", n_head * hd, n_embd)
        g.w(p + "attn_k.weight", n_kv * hd, n_embd)
        g.w(p + "attn_v.weight", n_kv * hd, n_embd)
        g.w(p + "attn_output.weight", n_embd, n_head * hd)
        g.norm(p + "attn_q_norm.weight", hd)
        g.norm(p + "attn_k_norm.weight", hd)
        g.norm(p + "post_attention_norm.weight", n_embd)
        g.norm(p + "ffn_norm.weight", n_embd)
        g.w(p + "ffn_gate.weight", n_ff, n_embd)
        g.w(p + "ffn_up.weight", n_ff, n_embd)
        g.w(p + "ffn_down.weight", n_embd, n_ff)
        g.norm(p + "post_ffw_norm.weight", n_embd)
    g.norm("output_norm.weight", n_embd)
    return "gemma3", kv, vocab  # tied: lm_head is skipped (Gemma3Model.filter_tensors)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf-py", default=os.environ.get("GGUF_PY"))
    ap.add_argument("--family", required=True, choices=["qwen35", "qwen35moe", "gpt-oss", "glm4moe", "gemma3"])
    ap.add_argument("--type", default="f32", choices=["f32", "q8_0", "q4_0", "mxfp4"])
    ap.add_argument("--rest", default="f32", choices=["f32", "f16", "bf16", "q8_0"],
                    help="mxfp4: the type of the tensors that are not experts")
    ap.add_argument("--tied", action="store_true", help="qwen35: tie_word_embeddings (no output.weight)")
    ap.add_argument("--rope-linear", action="store_true", help="gemma3: linear rope scaling 8 (4B and up)")
    ap.add_argument("--nextn", type=int, default=0, help="qwen35*, glm4moe: MTP blocks after the layers")
    ap.add_argument("--qk-norm", action="store_true", help="glm4moe: attn_q_norm/attn_k_norm (GLM-4.5 355B)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", dest="out", required=True)
    a = ap.parse_args()
    if not a.gguf_py or not os.path.isdir(a.gguf_py):
        sys.exit("gguf_py_gen: --gguf-py DIR (or GGUF_PY) must name llama.cpp's gguf-py directory")
    sys.path.insert(0, a.gguf_py)
    g = Gen(a)
    fam = a.family
    if fam in ("qwen35", "qwen35moe"):
        arch, kv, vocab = gen_qwen35(g, fam == "qwen35moe")
    elif fam == "gpt-oss":
        arch, kv, vocab = gen_gptoss(g)
    elif fam == "glm4moe":
        arch, kv, vocab = gen_glm4moe(g)
    else:
        arch, kv, vocab = gen_gemma3(g)
    if a.type == "mxfp4" and fam != "gpt-oss":
        sys.exit("gguf_py_gen: mxfp4 is for gpt-oss")
    g.write(a.out, arch, kv, vocab)


if __name__ == "__main__":
    main()
