#!/usr/bin/env python3
"""PyTorch peer of `moeplan run`: the same model as a plan's (read from plan.json), the same batch
(mbs x seq_len tokens per step), trained with AdamW, timed eager and under torch.compile.

The model follows moeplan's: embedding; blocks of RMSNorm, causal attention (GQA with RoPE, or MLA
with its low-rank q/kv, norms and the shared RoPE key) through scaled_dot_product_attention,
residual, RMSNorm, dense SwiGLU or the dropless MoE layer (fp32 router, softmax or sigmoid scores,
top-k, argsort permutation, torch._grouped_mm experts, weighted index_add combine, shared
experts), residual; final RMSNorm; LM head; cross-entropy. fp32 parameters with bf16 autocast
(moeplan: fp32 masters, bf16 GEMMs). Model FLOPs per token are the plan's (moeplan's count), so
TFLOPS and MFU compare with `moeplan run`'s.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from timing import median_ms, write_json


def rope(x, theta):
    """Rotate-half RoPE over the last dim of x (batch, seq, heads, dim)."""
    s, d = x.shape[1], x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = torch.arange(s, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    a, b = x[..., : d // 2].float(), x[..., d // 2:].float()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Attention(nn.Module):
    def __init__(self, m):
        super().__init__()
        a, h = m["attention"], m["hidden"]
        self.mla = a["type"] == "mla"
        self.H, self.theta = a["heads"], a.get("rope_theta", 10000)
        self.eps = m.get("norm_eps", 1e-6)
        if not self.mla:
            self.KV, self.hd = a["kv_heads"], a["head_dim"]
            self.wq = nn.Linear(h, self.H * self.hd, bias=False)
            self.wk = nn.Linear(h, self.KV * self.hd, bias=False)
            self.wv = nn.Linear(h, self.KV * self.hd, bias=False)
            self.wo = nn.Linear(self.H * self.hd, h, bias=False)
        else:
            self.ql, self.kvl = a.get("q_lora_rank", 0), a["kv_lora_rank"]
            self.nope, self.rope, self.dv = a["qk_nope_head_dim"], a["qk_rope_head_dim"], a["v_head_dim"]
            qk = self.nope + self.rope
            if self.ql:
                self.wqa = nn.Linear(h, self.ql, bias=False)
                self.qa_norm = nn.RMSNorm(self.ql, eps=self.eps)
                self.wqb = nn.Linear(self.ql, self.H * qk, bias=False)
            else:
                self.wq = nn.Linear(h, self.H * qk, bias=False)
            self.wkva = nn.Linear(h, self.kvl + self.rope, bias=False)
            self.kva_norm = nn.RMSNorm(self.kvl, eps=self.eps)
            self.wkvb = nn.Linear(self.kvl, self.H * (self.nope + self.dv), bias=False)
            self.wo = nn.Linear(self.H * self.dv, h, bias=False)

    def forward(self, x):
        B, S, _ = x.shape
        if not self.mla:
            q = rope(self.wq(x).view(B, S, self.H, self.hd), self.theta)
            k = rope(self.wk(x).view(B, S, self.KV, self.hd), self.theta)
            v = self.wv(x).view(B, S, self.KV, self.hd)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True)
        else:
            qf = self.wqb(self.qa_norm(self.wqa(x))) if self.ql else self.wq(x)
            qf = qf.view(B, S, self.H, self.nope + self.rope)
            ckv = self.wkva(x)
            kv = self.wkvb(self.kva_norm(ckv[..., : self.kvl])).view(B, S, self.H, self.nope + self.dv)
            kr = rope(ckv[..., self.kvl:].view(B, S, 1, self.rope), self.theta).expand(B, S, self.H, self.rope)
            q = torch.cat([rope(qf[..., self.nope:], self.theta), qf[..., : self.nope]], -1)
            k = torch.cat([kr, kv[..., : self.nope]], -1)
            v = kv[..., self.nope:]
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(B, S, -1))


class MoE(nn.Module):
    def __init__(self, m):
        super().__init__()
        e, h = m["moe"], m["hidden"]
        self.E, self.k, self.f = e["experts"], e["top_k"], e["intermediate"]
        self.sigmoid = e.get("scoring", "softmax") == "sigmoid"
        self.norm = e.get("norm_topk", False)
        self.after = e.get("softmax_after_topk", False)
        self.scale = e.get("scaling", 1.0)
        self.router = nn.Linear(h, self.E, bias=False)
        self.gate = nn.Parameter(torch.randn(self.E, self.f, h) * 0.02)
        self.up = nn.Parameter(torch.randn(self.E, self.f, h) * 0.02)
        self.down = nn.Parameter(torch.randn(self.E, h, self.f) * 0.02)
        fs = e.get("shared_experts", 0) * e.get("shared_intermediate", e["intermediate"])
        self.shared = SwiGLU(h, fs) if fs else None

    def forward(self, x):
        B, S, h = x.shape
        t = x.reshape(-1, h)
        with torch.autocast("cuda", enabled=False):
            z = F.linear(t.float(), self.router.weight.float())
        s = torch.sigmoid(z) if self.sigmoid else torch.softmax(z, -1)
        w, ch = torch.topk(s, self.k, dim=-1)
        if self.after:
            w = torch.softmax(torch.gather(z, 1, ch), -1)
        elif self.norm:
            w = w / w.sum(-1, keepdim=True)
        w = w * self.scale
        flat = ch.flatten()
        order = torch.argsort(flat, stable=True)
        src = order // self.k
        counts = torch.bincount(flat, minlength=self.E)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xp = t[src].to(torch.bfloat16)
        g = torch._grouped_mm(xp, self.gate.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        u = torch._grouped_mm(xp, self.up.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        yp = torch._grouped_mm(F.silu(g) * u, self.down.to(torch.bfloat16).transpose(-2, -1), offs=offs)
        y = torch.zeros(t.shape, device=x.device, dtype=torch.float32)
        y = y.index_add(0, src, yp.float() * w.flatten()[order, None])
        if self.shared is not None:
            y = y + self.shared(t).float()
        return y.to(x.dtype).view(B, S, h)


class Block(nn.Module):
    def __init__(self, m, moe):
        super().__init__()
        eps = m.get("norm_eps", 1e-6)
        self.n1, self.n2 = nn.RMSNorm(m["hidden"], eps=eps), nn.RMSNorm(m["hidden"], eps=eps)
        self.attn = Attention(m)
        self.ffn = MoE(m) if moe else SwiGLU(m["hidden"], m["dense_intermediate"])

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.ffn(self.n2(x))


class Model(nn.Module):
    def __init__(self, m):
        super().__init__()
        fd, every = m.get("first_dense", 0), m.get("moe_every", 1)
        self.embed = nn.Embedding(m["vocab"], m["hidden"])
        self.blocks = nn.ModuleList(Block(m, i >= fd and (i - fd) % every == every - 1) for i in range(m["layers"]))
        self.norm = nn.RMSNorm(m["hidden"], eps=m.get("norm_eps", 1e-6))
        self.head = nn.Linear(m["hidden"], m["vocab"], bias=False)

    def forward(self, tok, tgt):
        x = self.embed(tok)
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))


def bench(model, opt, tok, tgt, steps, warmup):
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    ms, loss = median_ms(step, warmup, steps)
    return ms, float(loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--json")
    a = ap.parse_args()
    plan = json.load(open(a.plan))
    m, lay, pred = plan["model"], plan["layout"], plan["prediction"]
    B, S = lay["mbs"], lay["seq_len"]
    flops_tok = pred["model_tflops_per_gpu"] * 1e12 / pred["tokens_per_s_per_gpu"]
    peak = pred["model_tflops_per_gpu"] / pred["mfu"]
    torch.manual_seed(1)
    dev = "cuda"
    tok = torch.randint(0, 256, (B, S), device=dev)
    tgt = torch.randint(0, 256, (B, S), device=dev)
    out = {"torch": torch.__version__, "model": m["name"], "mbs": B, "seq_len": S}
    for mode in a.modes.split(","):
        model = Model(m).to(dev)
        for p in model.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        run = torch.compile(model) if mode == "compile" else model
        t0 = time.time()
        ms, loss = bench(run, opt, tok, tgt, a.steps, a.warmup)
        tps = B * S / (ms / 1e3)
        tf = flops_tok * tps / 1e12
        out[mode] = {"step_ms": ms, "tokens_per_s": tps, "model_tflops": tf, "mfu": tf / peak,
                     "wall_s": time.time() - t0, "loss": loss,
                     "peak_memory_bytes": torch.cuda.max_memory_allocated()}
        print(f"torch {torch.__version__} {mode}: {m['name']} mbs {B} x seq {S}: step {ms:.1f} ms, "
              f"{tps:.0f} tokens/s, {tf:.1f} model TFLOPS, MFU {100 * tf / peak:.1f}%", flush=True)
        del model, opt, run
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    if a.json:
        write_json(a.json, out)


if __name__ == "__main__":
    main()
