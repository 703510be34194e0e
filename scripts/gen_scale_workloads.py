"""Generates three GiB-scale allocation traces with the structure of real
workloads (issue 42, item 4), as ascmem CSV (op,id,size; gzip when the name
ends .gz).  A script, not data: nothing it writes is committed.

  decoder7b_serving  a 7B-parameter decoder (32 layers, d_model 4096, MLP
                     11008, 32 heads, vocabulary 32000) in bf16 serving
                     with continuous batching: the weights of each layer
                     allocated at load, then up to 8 requests at once, each
                     prefilled alone when it arrives (prompt 128-2048
                     tokens) and decoded one token a step with the others
                     (16-192 new tokens, 16 requests in all); each request keeps per layer a K
                     and a V cache that grows by reallocation every 16
                     tokens (the old one freed after the copy), and every
                     step makes and frees per layer the activations of
                     attention and the MLP
  resnet50_train_b256  ResNet-50 (bottleneck blocks, He et al. 2015) training
                     at batch 256, 224 px, fp32: 3 steps of forward (each
                     convolution's and batch norm's output kept for
                     backward, a convolution workspace per call), backward
                     in reverse (gradients of activations made and freed,
                     weight gradients made at the first step and kept) and
                     SGD with momentum (buffers made at the first step)
  sdxl_unet_1024     an SDXL-shaped UNet (channels 320/640/1280, 2/2/10
                     transformer blocks at the two lower levels) denoising a
                     1024x1024 image (128x128 latents, two images, batch 4
                     with classifier-free guidance) in fp16 for 4 steps: weights
                     at load, per step the encoder's skip outputs kept until
                     the decoder takes them, attention scores materialised
                     per transformer block (no fused kernel), the rest made
                     and freed as consumed

    python scripts/gen_scale_workloads.py OUTDIR [NAME ...]

Sizes follow the tensors' shapes; the order of allocations and frees follows
what PyTorch's caching allocator sees for such models (a tensor freed when its
last use is done).  `ascmem fit OUTDIR/NAME.csv.gz` reads them;
scripts/frugality_table.py takes them as extra traces.
"""
import gzip
import os
import random
import sys

BF16 = FP16 = 2
FP32 = 4


class Trace:
    """Allocations and frees in order, written as ascmem CSV."""

    def __init__(self):
        self.lines = ["op,id,size"]
        self.next_id = 0
        self.live = {}

    def alloc(self, size):
        i = self.next_id
        self.next_id += 1
        size = max(int(size), 1)
        self.live[i] = size
        self.lines.append(f"a,{i},{size}")
        return i

    def free(self, *ids):
        for i in ids:
            self.lines.append(f"f,{i},{self.live.pop(i)}")

    def temp(self, size):
        """A tensor made and freed at once (a workspace, a reduction)."""
        self.free(self.alloc(size))

    def save(self, path):
        data = ("\n".join(self.lines) + "\n").encode()
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "wb") as f:
            f.write(data)


# ---- a 7B decoder serving with continuous batching --------------------------------------------

def decoder7b_serving(seed=11):
    t = Trace()
    d, ff, layers, vocab, slots, total, chunk = 4096, 11008, 32, 32000, 8, 16, 16
    kv_token = d * BF16  # K (or V) of one token in one layer
    t.alloc(vocab * d * BF16)  # embedding
    for _ in range(layers):  # per layer: q, k, v, o, gate, up, down and two norms
        for shape in ((d, d), (d, d), (d, d), (d, d), (ff, d), (ff, d), (d, ff), (d,), (d,)):
            n = 1
            for s in shape:
                n *= s
            t.alloc(n * BF16)
    t.alloc(d * BF16)
    t.alloc(vocab * d * BF16)  # output head
    rng = random.Random(seed)
    plan = [(rng.randint(128, 2048), rng.randint(16, 192)) for _ in range(total)]

    def forward(tokens, caches_of):
        """One forward of `tokens` new tokens per request (a list of
        requests' cache lists, one (k, v, capacity, length) per layer)."""
        n = tokens * len(caches_of)
        x = t.alloc(n * d * BF16)
        for layer in range(layers):
            h = t.alloc(n * d * BF16)  # normed input
            qkv = t.alloc(3 * n * d * BF16)
            t.free(h)
            for caches in caches_of:  # the new K and V go into each request's cache
                k, v, cap, length = caches[layer]
                if length + tokens > cap:  # grown by reallocation: copy, then free the old
                    cap = (length + tokens + chunk - 1) // chunk * chunk
                    k2, v2 = t.alloc(cap * kv_token), t.alloc(cap * kv_token)
                    if k is not None:
                        t.free(k, v)
                    k, v = k2, v2
                caches[layer] = (k, v, cap, length + tokens)
                if tokens > 1:  # prefill: attention scores of the prompt, fp32 softmax
                    s = t.alloc(32 * tokens * tokens * FP32)
                    t.free(s)
            att = t.alloc(n * d * BF16)
            t.free(qkv)
            o = t.alloc(n * d * BF16)
            t.free(att)
            x2 = t.alloc(n * d * BF16)
            t.free(x, o)
            h = t.alloc(n * d * BF16)
            gate, up = t.alloc(n * ff * BF16), t.alloc(n * ff * BF16)
            t.free(h)
            act = t.alloc(n * ff * BF16)
            t.free(gate, up)
            down = t.alloc(n * d * BF16)
            t.free(act)
            x = t.alloc(n * d * BF16)
            t.free(x2, down)
        logits = t.alloc(len(caches_of) * vocab * FP32)  # the last position of each request
        t.free(x)
        t.temp(len(caches_of) * 8)  # argmax
        t.free(logits)

    waiting, active = list(plan), []
    while waiting or active:
        while waiting and len(active) < slots:
            prompt, new = waiting.pop(0)
            caches = [(None, None, 0, 0)] * layers
            forward(prompt, [caches])
            active.append([caches, new])
        forward(1, [r[0] for r in active])
        for r in active:
            r[1] -= 1
        for r in [r for r in active if r[1] <= 0]:
            for k, v, _, _ in r[0]:
                t.free(k, v)
            active.remove(r)
    return t


# ---- ResNet-50 training at batch 256 ---------------------------------------------------------

def resnet50_convs():
    """(cin, cout, kernel, stride, input side) of every convolution, in order,
    with the bottleneck block each belongs to (None for the stem)."""
    convs = [(3, 64, 7, 2, 224, None)]
    side, cin, block = 56, 64, 0
    for mid, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            s = stride if i == 0 else 1
            convs += [(cin, mid, 1, 1, side, block), (mid, mid, 3, s, side, block),
                      (mid, mid * 4, 1, 1, side // s, block)]
            if i == 0:
                convs.append((cin, mid * 4, 1, s, side, block))  # the projection shortcut
            side //= s
            cin = mid * 4
            block += 1
    return convs


def resnet50_train_b256(steps=3, batch=256):
    t = Trace()
    convs = resnet50_convs()
    weights = [t.alloc(ci * co * k * k * FP32) for ci, co, k, _, _, _ in convs]
    bn = [t.alloc(2 * co * FP32) for _, co, _, _, _, _ in convs]  # weight and bias
    fc = t.alloc(2048 * 1000 * FP32)
    grads, momenta = None, None
    for _ in range(steps):
        x = t.alloc(batch * 3 * 224 * 224 * FP32)
        labels = t.alloc(batch * 8)
        saved = []  # (conv output, bn output) per convolution, for backward
        inp = x
        for ci, co, k, s, side, _ in convs:
            out_side = side // s
            act = batch * co * out_side * out_side * FP32
            t.temp(min(act, 256 << 20))  # convolution workspace
            c = t.alloc(act)
            b = t.alloc(act)  # batch norm output (ReLU in place)
            t.temp(2 * co * FP32)  # batch statistics
            saved.append((c, b))
            if k == 7:
                pooled = t.alloc(batch * 64 * 56 * 56 * FP32)  # max pool, kept for backward
                saved.append((pooled, None))
        feat = t.alloc(batch * 2048 * FP32)
        logits = t.alloc(batch * 1000 * FP32)
        t.temp(batch * FP32)
        # backward
        g = t.alloc(batch * 1000 * FP32)
        t.free(logits)
        gfeat = t.alloc(batch * 2048 * FP32)
        t.free(g, feat)
        first = grads is None
        if first:
            grads = [t.alloc(ci * co * k * k * FP32) for ci, co, k, _, _, _ in convs]
            grads += [t.alloc(2 * co * FP32) for _, co, _, _, _, _ in convs]
            grads.append(t.alloc(2048 * 1000 * FP32))
        gout = gfeat
        for (ci, co, k, s, side, _), pair in zip(reversed(convs), reversed(
                [p for p in saved if p[1] is not None])):
            c, b = pair
            act = t.live[c]
            gb = t.alloc(act)  # through batch norm
            t.free(gout, b)
            t.temp(min(act, 256 << 20))  # weight-gradient workspace
            gin = t.alloc(batch * ci * side * side * FP32)  # input gradient
            t.free(gb, c)
            gout = gin
        for p in saved:
            if p[1] is None:
                t.free(p[0])
        t.free(gout, x, labels)
        if momenta is None:
            momenta = [t.alloc(t.live[w]) for w in weights + bn + [fc]]
        for w in weights + bn + [fc]:
            t.temp(t.live[w])  # the optimizer's temporary per parameter
    return t


# ---- an SDXL-shaped UNet at 1024x1024 --------------------------------------------------------

def sdxl_unet_1024(steps=4, batch=4):
    t = Trace()
    side = 128  # latents of a 1024x1024 image
    levels = ((320, 0), (640, 2), (1280, 10))  # channels, transformer blocks per attention
    text, ctx = 77, 2048
    # weights: ~2.6 billion fp16 parameters, allocated per module
    for ch, depth in levels:
        for _ in range(2 + 3):  # encoder and decoder resnets
            t.alloc(2 * 9 * ch * ch * FP16)
        for _ in range(depth * (2 + 3)):
            for n in (4 * ch * ch, 2 * ch * ctx, 8 * ch * ch, 4 * ch * ch):
                t.alloc(n * FP16)
    for _ in range(10):  # the middle block's transformers
        for n in (4 * 1280 * 1280, 2 * 1280 * ctx, 8 * 1280 * 1280, 4 * 1280 * 1280):
            t.alloc(n * FP16)
    latents = t.alloc(batch * 4 * side * side * FP16)
    cond = t.alloc(batch * text * ctx * FP16)

    def resnet(x, ch, s):
        h = t.alloc(batch * ch * s * s * FP16)
        h2 = t.alloc(batch * ch * s * s * FP16)
        t.free(h)
        out = t.alloc(batch * ch * s * s * FP16)
        t.free(h2, x)
        return out

    def transformer(x, ch, s, depth):
        n = s * s
        heads = ch // 64
        for _ in range(depth):
            h = t.alloc(batch * n * ch * FP16)
            qkv = t.alloc(3 * batch * n * ch * FP16)
            scores = t.alloc(batch * heads * n * n * FP16)
            probs = t.alloc(batch * heads * n * n * FP16)
            t.free(scores)
            att = t.alloc(batch * n * ch * FP16)
            t.free(probs, qkv, h)
            x2 = t.alloc(batch * n * ch * FP16)
            t.free(x, att)
            q = t.alloc(batch * n * ch * FP16)  # cross-attention over the text
            cs = t.alloc(batch * heads * n * text * FP16)
            ca = t.alloc(batch * n * ch * FP16)
            t.free(q, cs)
            x3 = t.alloc(batch * n * ch * FP16)
            t.free(x2, ca)
            ff = t.alloc(batch * n * 8 * ch * FP16)  # GEGLU
            g = t.alloc(batch * n * 4 * ch * FP16)
            t.free(ff)
            x = t.alloc(batch * n * ch * FP16)
            t.free(x3, g)
        return x

    for _ in range(steps):
        x = t.alloc(batch * 320 * side * side * FP16)
        skips, s = [], side
        for li, (ch, depth) in enumerate(levels):
            for _ in range(2):
                x = resnet(x, ch, s)
                if depth:
                    x = transformer(x, ch, s, depth)
                skips.append((x, ch, s))
                x = t.alloc(batch * ch * s * s * FP16)  # the skip is kept; the path goes on
            if li + 1 < len(levels):
                nxt = t.alloc(batch * levels[li + 1][0] * (s // 2) ** 2 * FP16)
                t.free(x)
                x, s = nxt, s // 2
        x = resnet(x, 1280, s)
        x = transformer(x, 1280, s, 10)
        for li, (ch, depth) in reversed(list(enumerate(levels))):
            for _ in range(3 if skips and skips[-1][2] == s else 0):
                if not skips or skips[-1][2] != s:
                    break
                skip, sch, _ = skips.pop()
                cat = t.alloc(batch * (ch + sch) * s * s * FP16)
                t.free(x, skip)
                x = resnet(cat, ch, s)
                if depth:
                    x = transformer(x, ch, s, depth)
            if li:
                up = t.alloc(batch * ch * (2 * s) ** 2 * FP16)
                t.free(x)
                x, s = up, 2 * s
        eps = t.alloc(batch * 4 * side * side * FP16)
        t.free(x)
        guided = t.alloc(batch // 2 * 4 * side * side * FP16)
        t.free(eps)
        nl = t.alloc(batch * 4 * side * side * FP16)
        t.free(latents, guided)
        latents = nl
    t.free(latents, cond)
    return t


WORKLOADS = (("decoder7b_serving", decoder7b_serving), ("resnet50_train_b256", resnet50_train_b256),
             ("sdxl_unet_1024", sdxl_unet_1024))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python scripts/gen_scale_workloads.py OUTDIR [NAME ...]", file=sys.stderr)
        return 2
    out, names = argv[0], argv[1:]
    os.makedirs(out, exist_ok=True)
    for name, make in WORKLOADS:
        if names and name not in names:
            continue
        t = make()
        path = os.path.join(out, name + ".csv.gz")
        t.save(path)
        peak, live = 0, 0
        for line in t.lines[1:]:
            op, _, size = line.split(",")
            live += int(size) if op == "a" else -int(size)
            peak = max(peak, live)
        print(f"{name}: {len(t.lines) - 1} events, peak live {peak / 2**30:.2f} GiB -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
