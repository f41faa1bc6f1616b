"""The PyTorch twin of nn.NewCharLM: minGPT's GPT (karpathy/minGPT,
mingpt/model.py) cut down to what Starling builds, with the same module
names, so that

    model.load_state_dict(safetensors.torch.load_file("charlm.safetensors"))

loads the weights a Starling CharLM saved (Model.SaveFile), and
model(idx) gives the logits Starling's Model.Forward gives for the same
token ids (up to float32 rounding). Starling's layouts: Linear weights
[out, in], c_attn's 3*n_embd outputs are q, k, v (each n_head heads of
n_embd/n_head consecutive values), wpe is a [block_size, n_embd] table.

Differences from minGPT: no attention-probability dropout (attn_pdrop is
0); GELU is torch's approximate='tanh' (minGPT's NewGELU); no weight
tying (neither has any). To load into torch.nn.MultiheadAttention
instead, rename attn.c_attn.weight/bias to in_proj_weight/in_proj_bias
and attn.c_proj to out_proj (and pass a causal attn_mask).

nn's TestTorchParity checks exactly that (torch_check.py, with
torch alone).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, mlp_ratio, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(
            c_fc=nn.Linear(n_embd, mlp_ratio * n_embd),
            act=nn.GELU(approximate="tanh"),
            c_proj=nn.Linear(mlp_ratio * n_embd, n_embd),
            dropout=nn.Dropout(dropout),
        ))

    def forward(self, x):
        m = self.mlp
        x = x + self.attn(self.ln_1(x))
        x = x + m.dropout(m.c_proj(m.act(m.c_fc(self.ln_2(x)))))
        return x


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_embd, n_head, n_layer,
                 mlp_ratio=4, dropout=0.0):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(n_embd, n_head, mlp_ratio, dropout)
                             for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits
        # Starling's NextTokenCrossEntropy: the mean over every position.
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss
