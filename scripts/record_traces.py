"""Records real allocation traces of seventeen model families with PyTorch's
profiler on the CPU, as ../shared/traces/README.md describes for
pipeline.csv.gz, into src/ascmem/examples/ (ascmem's CSV, gzip):

  resnet50_multires  ResNet-50 inference (torch.nn, bottleneck blocks as in He
                     et al. 2015), batch 4, input 224, 320 and 448 pixels in turn
  encoder_varlen     a BERT-base-sized encoder (nn.TransformerEncoder: 6 layers
                     of d_model 768, 12 heads, FFN 3072) at batch 1-16 and
                     sequence length 16-384 drawn at random
  decoder_kvcache    a GPT-style decoder (8 layers, d_model 512, 8 heads) that
                     generates 96 tokens after a 64-token prompt for 4 requests
                     of batch 1-4, its KV cache grown by torch.cat each step
  unet_multires      a U-Net (4 levels, 32-256 channels, skip connections
                     by concatenation) at batch 2, input 256, 384, 512 and 320
                     pixels, three passes each
  vit_train          training steps of a ViT-S-sized image transformer (patch
                     16, 6 layers of d_model 384, 6 heads) with SGD and
                     momentum, batch 4-16 and input 160 or 224 pixels drawn at
                     random: forward, backward and optimizer step
  resnet18_train     ResNet-18 training steps (Adam), batch 8-24, 128-192 px
  seq2seq_generate   nn.Transformer (d_model 384, 3 + 3 layers) generating
                     16-48 tokens greedily, without a cache, for 6 requests
  gru_lm             a 2-layer GRU language model (hidden 1024) scoring
                     batches of 4-32 sequences of 32-200 tokens
  mobilenet_multires MobileNetV2 inference (inverted residual blocks,
                     depthwise convolutions), batch 1-8, 160-320 pixels
  bert_train         training steps (AdamW) of a small BERT-style encoder
                     (4 layers of d_model 256), masked-token loss over a
                     vocabulary of 8,000, batch 4-16, 32-192 tokens
  decoder_static_cache  a decoder (6 layers, d_model 512, RMS norm, SwiGLU)
                     whose KV cache is allocated once per request at its
                     full length and written in place, 5 requests
  diffusion_denoise  a latent-diffusion-style denoising loop (a U-Net of
                     attention blocks, guidance doubling the batch), 12
                     steps on latents of 32, 48 and 32 pixels
  speech_to_text     a Whisper-style encoder (convolutions, 4 layers) and a
                     4-layer decoder with cross-attention and a KV cache
                     grown by torch.cat, 5 requests of batch 1-4
  convnext_multires  ConvNeXt-T-shaped inference (7x7 depthwise convolutions,
                     channels-last layer norm and MLP), batch 1-8, 160-288 px
  lstm_tagger_train  training steps (Adam) of a 2-layer bidirectional LSTM
                     tagger, batches of 8-64 sequences of 16-128 tokens
  moe_train          training steps (AdamW) of a mixture-of-experts
                     transformer (4 layers, 8 experts, top-2 routing)
  llm_serving        continuous batching on a 6-layer decoder: 5 slots, 10
                     requests, a KV cache per request grown by torch.cat

Weights are made before recording, so the traces hold the activations,
workspaces and caches of inference, as the pipeline trace does (and, for
the training traces, the gradients, the optimizer state made at the
first step, and the activations kept for backward).  unet_multires and
vit_train were recorded after the placement rules they are checked against
were chosen (sixth session), to judge them on models they were not tuned
on; so were decoder_static_cache, bert_train and mobilenet_multires (eighth
session), after the reach of the granule position rule was chosen, and the
two after them (fifteenth session), after the paged pools' "mapped
granules first" rule was; the two after them (sixteenth session), and
the last two (eighteenth session), after every rule in the code.  Needs
torch (2.13.0 CPU was used):
python scripts/record_traces.py [NAME ...]
With ASCMEM_TRACE_DIR set the traces go there instead (to hold new ones out
of the repository while a placement change is judged on them).
"""
import gzip
import json
import math
import os
import random
import sys
import tempfile

import torch
from torch import nn

OUT = os.path.join(os.path.dirname(__file__), "..", "src", "ascmem", "examples")


def memory_events(fn):
    """Runs fn under the profiler; the [memory] events, in the profiler's order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    mem = [e for e in events if e.get("name") == "[memory]"]
    mem.sort(key=lambda e: e["ts"])  # stable: ties keep the profiler's order
    return mem


def to_csv(mem):
    """Pairs frees with allocations by address; frees of blocks allocated
    before recording are dropped."""
    live, lines, next_id = {}, ["op,id,size"], 0
    for e in mem:
        addr, nbytes = e["args"]["Addr"], e["args"]["Bytes"]
        if nbytes > 0:
            live[addr] = (next_id, nbytes)
            lines.append(f"a,{next_id},{nbytes}")
            next_id += 1
        elif nbytes < 0 and addr in live:
            i, n = live.pop(addr)
            lines.append(f"f,{i},{n}")
    return "\n".join(lines) + "\n"


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, stride):
        super().__init__()
        cout = mid * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def resnet50():
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for mid, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, mid, stride if i == 0 else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers).eval()


def resnet50_multires():
    model = resnet50()

    def run():
        with torch.no_grad():
            for res in (224, 320, 448, 224, 448, 320):
                model(torch.randn(4, 3, res, res)).softmax(-1)
    return run


def encoder_varlen():
    layer = nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True)
    model = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).eval()
    rng = random.Random(7)
    shapes = [(rng.choice((1, 2, 4, 8, 16)), rng.choice((16, 32, 64, 128, 256, 384)))
              for _ in range(14)]

    def run():
        with torch.no_grad():
            for batch, seq in shapes:
                model(torch.randn(batch, seq, 768)).mean(1)
    return run


class DecoderLayer(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x, cache):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        if cache is not None:  # the KV cache grows by concatenation, one step at a time
            k, v = torch.cat((cache[0], k), 1), torch.cat((cache[1], v), 1)
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=cache is None)
        x = x + self.out(att.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.n2(x)), (k, v)


def decoder_kvcache():
    d, vocab = 512, 32000
    emb, head = nn.Embedding(vocab, d), nn.Linear(d, vocab)
    layers = [DecoderLayer(d, 8).eval() for _ in range(8)]

    def generate(batch):
        tokens = torch.randint(0, vocab, (batch, 64))
        caches = [None] * len(layers)
        x = emb(tokens)
        for _ in range(96):
            for i, layer in enumerate(layers):
                x, caches[i] = layer(x, caches[i])
            nxt = head(x[:, -1]).argmax(-1, keepdim=True)
            x = emb(nxt)

    def run():
        with torch.no_grad():
            for batch in (1, 4, 2, 3):
                generate(batch)
    return run


def conv_block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    def __init__(self, c=32):
        super().__init__()
        self.down = nn.ModuleList([conv_block(3, c), conv_block(c, 2 * c), conv_block(2 * c, 4 * c),
                                   conv_block(4 * c, 8 * c)])
        self.up = nn.ModuleList([conv_block(12 * c, 4 * c), conv_block(6 * c, 2 * c),
                                 conv_block(3 * c, c)])
        self.out = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else nn.functional.max_pool2d(x, 2))
            skips.append(x)
        for block, skip in zip(self.up, reversed(skips[:-1])):
            x = block(torch.cat((nn.functional.interpolate(x, scale_factor=2), skip), 1))
        return self.out(x)


def unet_multires():
    model = UNet().eval()

    def run():
        with torch.no_grad():
            for res in (256, 384, 512, 320):
                for _ in range(3):
                    model(torch.randn(2, 3, res, res))
    return run


class ViT(nn.Module):
    def __init__(self, d=384, layers=6, heads=6, patch=16, classes=100):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        return self.head(self.encoder(tokens).mean(1))


def training_steps(model, opt, steps):
    """One training step per (batch, resolution) of random images and labels
    of 100 classes: forward, cross entropy, backward, optimizer step."""
    def run():
        for batch, res in steps:
            loss = nn.functional.cross_entropy(model(torch.randn(batch, 3, res, res)),
                                               torch.randint(0, 100, (batch,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


def vit_train():
    model = ViT().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = random.Random(11)
    steps = [(rng.choice((4, 8, 16)), rng.choice((160, 224))) for _ in range(8)]
    return training_steps(model, opt, steps)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                  nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(cout))
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def resnet18_train():
    widths, blocks, cin = (64, 128, 256, 512), [], 64
    for i, w in enumerate(widths):
        blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
        cin = w
    model = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                          nn.MaxPool2d(3, 2, 1), *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(512, 100)).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = random.Random(23)
    steps = [(rng.choice((8, 16, 24)), rng.choice((128, 160, 192))) for _ in range(8)]
    return training_steps(model, opt, steps)


def seq2seq_generate():
    d, vocab = 384, 16000
    model = nn.Transformer(d, 6, 3, 3, 1536, batch_first=True).eval()
    emb, head = nn.Embedding(vocab, d), nn.Linear(d, vocab)
    rng = random.Random(31)
    requests = [(rng.choice((1, 2, 4, 8)), rng.choice((32, 64, 128, 256)), rng.choice((16, 32, 48)))
                for _ in range(6)]

    def run():
        with torch.no_grad():
            for batch, src_len, out_len in requests:
                memory = model.encoder(emb(torch.randint(0, vocab, (batch, src_len))))
                out = torch.zeros(batch, 1, dtype=torch.long)
                for _ in range(out_len):  # no cache: the decoder reruns on the growing output
                    y = model.decoder(emb(out), memory)
                    out = torch.cat((out, head(y[:, -1]).argmax(-1, keepdim=True)), 1)
    return run


def gru_lm():
    vocab, d = 20000, 512
    emb, gru, head = nn.Embedding(vocab, d), nn.GRU(d, 1024, 2, batch_first=True), nn.Linear(1024, vocab)
    rng = random.Random(41)
    shapes = [(rng.choice((4, 8, 16, 32)), rng.choice((32, 64, 128, 200))) for _ in range(12)]

    def run():
        with torch.no_grad():
            for batch, seq in shapes:
                out, _ = gru(emb(torch.randint(0, vocab, (batch, seq))))
                head(out).log_softmax(-1).max(-1)
    return run


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion, 3x3 depthwise, 1x1 projection."""
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        mid = cin * expand
        self.body = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(),
                                  nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False),
                                  nn.BatchNorm2d(mid), nn.ReLU6(),
                                  nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def mobilenet_multires():
    layers, cin = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()], 32
    for expand, cout, n, stride in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                                    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
            cin = cout
    layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6(),
               nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000)]
    model = nn.Sequential(*layers).eval()
    rng = random.Random(53)
    shapes = [(rng.choice((1, 2, 4, 8)), rng.choice((160, 224, 288, 320))) for _ in range(10)]

    def run():
        with torch.no_grad():
            for batch, res in shapes:
                model(torch.randn(batch, 3, res, res)).softmax(-1)
    return run


def bert_train():
    d, vocab = 256, 8000
    layer = nn.TransformerEncoderLayer(d, 4, 1024, batch_first=True)
    emb, body, head = nn.Embedding(vocab, d), nn.TransformerEncoder(layer, 4), nn.Linear(d, vocab)
    params = [*emb.parameters(), *body.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    rng = random.Random(61)
    shapes = [(rng.choice((4, 8, 16)), rng.choice((32, 64, 128, 192))) for _ in range(8)]

    def run():
        for batch, seq in shapes:  # masked-token prediction over the whole sequence
            tokens = torch.randint(0, vocab, (batch, seq))
            logits = head(body(emb(tokens)))
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


class StaticCacheLayer(nn.Module):
    """A decoder layer (RMS norm, SwiGLU) whose KV cache is allocated once per
    request at its full length and written in place, as serving engines do."""
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, 3 * d, bias=False)
        self.down = nn.Linear(3 * d, d, bias=False)
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)

    def forward(self, x, cache, pos):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        cache[0][:, pos:pos + t], cache[1][:, pos:pos + t] = k, v
        keys, values = cache[0][:, :pos + t], cache[1][:, :pos + t]
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), is_causal=pos == 0)
        x = x + self.out(att.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


def decoder_static_cache():
    d, heads, vocab = 512, 8, 32000
    emb, head = nn.Embedding(vocab, d), nn.Linear(d, vocab, bias=False)
    layers = [StaticCacheLayer(d, heads).eval() for _ in range(6)]
    rng = random.Random(71)
    requests = [(rng.choice((1, 2, 4)), rng.choice((32, 96, 160)), rng.choice((32, 64))) for _ in range(5)]

    def run():
        with torch.no_grad():
            for batch, prompt, new in requests:
                caches = [(torch.empty(batch, prompt + new, heads, d // heads),
                           torch.empty(batch, prompt + new, heads, d // heads)) for _ in layers]
                x, pos = emb(torch.randint(0, vocab, (batch, prompt))), 0
                for _ in range(new):
                    for layer, cache in zip(layers, caches):
                        x = layer(x, cache, pos)
                    pos += x.shape[1]
                    x = emb(head(x[:, -1:]).argmax(-1))
    return run


class DenoiseBlock(nn.Module):
    """A denoiser's residual block: two 3x3 convolutions with group norm, the
    timestep added between them, then self-attention over the pixels."""
    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(cin, cout, 3, padding=1), nn.Conv2d(cout, cout, 3, padding=1)
        self.n1, self.n2 = nn.GroupNorm(math.gcd(8, cin), cin), nn.GroupNorm(8, cout)
        self.t, self.skip = nn.Linear(tdim, cout), nn.Conv2d(cin, cout, 1)
        self.att = nn.MultiheadAttention(cout, 4, batch_first=True)

    def forward(self, x, t):
        h = self.c1(nn.functional.silu(self.n1(x))) + self.t(t)[:, :, None, None]
        h = self.c2(nn.functional.silu(self.n2(h))) + self.skip(x)
        b, c, hh, ww = h.shape
        s = h.flatten(2).transpose(1, 2)
        return h + self.att(s, s, s, need_weights=False)[0].transpose(1, 2).reshape(b, c, hh, ww)


def diffusion_denoise():
    """A latent-diffusion-style denoising loop: a two-level U-Net of
    attention blocks over 4-channel latents, classifier-free guidance (the
    batch doubled), 12 steps per prompt, latents of 32 and 48 pixels."""
    tdim = 128
    downs = [DenoiseBlock(4, 64, tdim), DenoiseBlock(64, 128, tdim)]
    mid = DenoiseBlock(128, 128, tdim)
    ups = [DenoiseBlock(256, 64, tdim), DenoiseBlock(128, 64, tdim)]
    temb, out = nn.Sequential(nn.Linear(1, tdim), nn.SiLU(), nn.Linear(tdim, tdim)), nn.Conv2d(64, 4, 1)
    for m in downs + [mid] + ups:
        m.eval()

    def unet(x, t):
        skips = []
        for i, blk in enumerate(downs):
            x = blk(x, t)
            skips.append(x)
            x = nn.functional.avg_pool2d(x, 2) if i == 0 else x
        x = mid(x, t)
        for i, blk in enumerate(ups):
            x = blk(torch.cat([x, skips.pop()], 1), t)
            x = nn.functional.interpolate(x, scale_factor=2) if i == 0 else x
        return out(x)

    def run():
        with torch.no_grad():
            for size in (32, 48, 32):
                x = torch.randn(1, 4, size, size)
                for step in range(12):
                    t = temb(torch.full((2, 1), 1.0 - step / 12))
                    eps = unet(torch.cat([x, x]), t)
                    x = x - 0.1 * (eps[:1] + 7.5 * (eps[1:] - eps[:1]))
    return run


class CrossDecoderLayer(nn.Module):
    """A speech-to-text decoder layer: self-attention over the tokens so far
    (its KV cache grown by torch.cat), cross-attention over the encoder's
    output (its keys and values made once per request), a GELU MLP."""
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.qkv, self.o1 = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.q2, self.kv2, self.o2 = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.n1, self.n2, self.n3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)

    def split(self, x):
        b, t, d = x.shape
        return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x, cache, cross):
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).chunk(3, -1)
        k, v = self.split(k), self.split(v)
        if cache:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        cache[:] = [k, v]
        a = nn.functional.scaled_dot_product_attention(self.split(q), k, v, is_causal=t > 1)
        x = x + self.o1(a.transpose(1, 2).reshape(b, t, d))
        a = nn.functional.scaled_dot_product_attention(self.split(self.q2(self.n2(x))), *cross)
        x = x + self.o2(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.n3(x))


def speech_to_text():
    """A Whisper-style model: two convolutions and a 4-layer encoder over 80
    mel bins of 10-30 s of audio (1000-3000 frames, halved), then a 4-layer
    decoder writing 24-64 tokens greedily, batch 1-4, 5 requests."""
    d, heads, vocab = 384, 6, 8000
    conv = nn.Sequential(nn.Conv1d(80, d, 3, padding=1), nn.GELU(),
                         nn.Conv1d(d, d, 3, stride=2, padding=1), nn.GELU())
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True,
                                                           norm_first=True), 4).eval()
    dec = [CrossDecoderLayer(d, heads).eval() for _ in range(4)]
    emb, head = nn.Embedding(vocab, d), nn.Linear(d, vocab, bias=False)
    rng = random.Random(83)
    requests = [(rng.choice((1, 2, 4)), rng.choice((1000, 2000, 3000)), rng.choice((24, 40, 64)))
                for _ in range(5)]

    def run():
        with torch.no_grad():
            for batch, frames, new in requests:
                audio = enc(conv(torch.randn(batch, 80, frames)).transpose(1, 2))
                cross = [[layer.split(z) for z in layer.kv2(audio).chunk(2, -1)] for layer in dec]
                caches = [[] for _ in dec]
                x = emb(torch.zeros(batch, 4, dtype=torch.long))
                for _ in range(new):
                    for layer, cache, kv in zip(dec, caches, cross):
                        x = layer(x, cache, kv)
                    x = emb(head(x[:, -1:]).argmax(-1))
    return run


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: 7x7 depthwise convolution, layer norm over channels,
    an MLP of 4x width with GELU, a learned per-channel scale, the residual."""
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, 1, 3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))
        self.scale = nn.Parameter(torch.full((c,), 1e-6))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)  # channels last for the norm and the MLP
        y = self.mlp(self.norm(y)) * self.scale
        return x + y.permute(0, 3, 1, 2)


def convnext_multires():
    """ConvNeXt-T-shaped inference (stages of 3, 3, 9, 3 blocks at 96-768
    channels, patchify stem, downsampling between stages), batch 1-8 at
    160-288 pixels drawn at random."""
    widths, depths, layers, cin = (96, 192, 384, 768), (3, 3, 9, 3), [], 3
    for i, (w, n) in enumerate(zip(widths, depths)):
        layers.append(nn.Conv2d(cin, w, 4 if i == 0 else 2, 4 if i == 0 else 2))
        layers += [ConvNeXtBlock(w) for _ in range(n)]
        cin = w
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(768, 1000)).eval()
    rng = random.Random(53)
    shapes = [(rng.choice((1, 2, 4, 8)), rng.choice((160, 224, 288))) for _ in range(8)]

    def run():
        with torch.no_grad():
            for batch, res in shapes:
                model(torch.randn(batch, 3, res, res))
    return run


def lstm_tagger_train():
    """Training steps (Adam) of a 2-layer bidirectional LSTM tagger (hidden
    512) over embeddings of a 30,000-word vocabulary, 40 tags, batches of
    8-64 sequences of 16-128 tokens drawn at random."""
    vocab, tags = 30000, 40
    emb, lstm = nn.Embedding(vocab, 256), nn.LSTM(256, 512, 2, batch_first=True, bidirectional=True)
    head = nn.Linear(1024, tags)
    params = [*emb.parameters(), *lstm.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    rng = random.Random(59)
    shapes = [(rng.choice((8, 16, 32, 64)), rng.choice((16, 32, 64, 128))) for _ in range(10)]

    def run():
        for batch, seq in shapes:
            out, _ = lstm(emb(torch.randint(0, vocab, (batch, seq))))
            loss = nn.functional.cross_entropy(head(out).reshape(-1, tags),
                                               torch.randint(0, tags, (batch * seq,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


class MoELayer(nn.Module):
    """A transformer layer whose MLP is a mixture of experts: each token goes
    to its router's top two of n experts, so each expert's batch (and every
    buffer gathered for it) has a size the data decides."""
    def __init__(self, d, heads, experts):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                                     for _ in range(experts))

    def forward(self, x):
        h = self.n1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        b, t, d = x.shape
        flat = self.n2(x).reshape(-1, d)
        weight, chosen = self.router(flat).softmax(-1).topk(2, -1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, expert(flat[rows]) * weight[rows, slot].unsqueeze(-1))
        return x + out.reshape(b, t, d)


def moe_train():
    """Training steps (AdamW) of a small mixture-of-experts transformer (4
    layers of d_model 256, 8 experts, top-2 routing) on a next-token loss
    over a vocabulary of 8,000, batch 4-16, 32-160 tokens drawn at random:
    per-expert batches of data-dependent size."""
    vocab, d = 8000, 256
    emb, head = nn.Embedding(vocab, d), nn.Linear(d, vocab)
    layers = nn.ModuleList(MoELayer(d, 4, 8) for _ in range(4))
    params = [*emb.parameters(), *layers.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    rng = random.Random(67)
    shapes = [(rng.choice((4, 8, 16)), rng.choice((32, 64, 96, 160))) for _ in range(10)]

    def run():
        for batch, seq in shapes:
            tokens = torch.randint(0, vocab, (batch, seq + 1))
            x = emb(tokens[:, :-1])
            for layer in layers:
                x = layer(x)
            loss = nn.functional.cross_entropy(head(x).reshape(-1, vocab), tokens[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


def llm_serving():
    """A decoder (6 layers, d_model 512, the DecoderLayer of decoder_kvcache)
    serving requests one at a time per slot with continuous batching: each
    step decodes one token for every active request, each request keeps its
    own KV cache grown by torch.cat, a request arrives with a prompt of
    16-256 tokens (prefilled alone) when a slot frees, and leaves after
    8-96 new tokens: caches of many lengths live and die interleaved, as in
    an inference server without paged KV caches."""
    d, vocab, slots, total = 512, 32000, 5, 10
    emb, head = nn.Embedding(vocab, d), nn.Linear(d, vocab)
    layers = [DecoderLayer(d, 8).eval() for _ in range(6)]
    rng = random.Random(71)
    plan = [(rng.randint(16, 256), rng.randint(8, 96)) for _ in range(total)]

    def step(x, caches):
        for i, layer in enumerate(layers):
            x, caches[i] = layer(x, caches[i])
        return head(x[:, -1]).argmax(-1, keepdim=True)

    def run():
        with torch.no_grad():
            waiting, active = list(plan), []  # active: [caches, next token, tokens left]
            while waiting or active:
                while waiting and len(active) < slots:
                    prompt, new = waiting.pop(0)
                    caches = [None] * len(layers)
                    nxt = step(emb(torch.randint(0, vocab, (1, prompt))), caches)
                    active.append([caches, nxt, new])
                for r in active:
                    r[1] = step(emb(r[1]), r[0])
                    r[2] -= 1
                active = [r for r in active if r[2] > 0]
    return run


RECORDERS = (("resnet50_multires", resnet50_multires), ("encoder_varlen", encoder_varlen),
             ("decoder_kvcache", decoder_kvcache), ("unet_multires", unet_multires),
             ("vit_train", vit_train), ("resnet18_train", resnet18_train),
             ("seq2seq_generate", seq2seq_generate), ("gru_lm", gru_lm),
             ("mobilenet_multires", mobilenet_multires), ("bert_train", bert_train),
             ("decoder_static_cache", decoder_static_cache),
             ("diffusion_denoise", diffusion_denoise), ("speech_to_text", speech_to_text),
             ("convnext_multires", convnext_multires), ("lstm_tagger_train", lstm_tagger_train),
             ("moe_train", moe_train), ("llm_serving", llm_serving))


def main():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    out = os.environ.get("ASCMEM_TRACE_DIR", OUT)  # elsewhere: traces held out of the repository
    for name, make in RECORDERS:
        if len(sys.argv) > 1 and name not in sys.argv[1:]:
            continue
        csv = to_csv(memory_events(make()))
        path = os.path.join(out, name + ".csv.gz")
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(csv.encode())
        print(f"{name}: {csv.count(chr(10)) - 1} events, {os.path.getsize(path)} bytes gzip")


if __name__ == "__main__":
    main()
