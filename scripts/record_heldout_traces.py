"""Records twenty-seven model families that none of the shipped examples covers, as
held-out traces for judging placement (issue 42, item 5), with the same
profiler recording as scripts/record_traces.py (its memory_events and
to_csv), into tests/data/heldout/ (ascmem's CSV, gzip):

  gnn_message_passing  a 3-layer graph convolution network (mean aggregation
                       by index_add over edge lists) on 12 random graphs of
                       200-3,000 nodes and 3-12 edges a node, inference
  detector_boxes       a single-stage detector: a small convolutional backbone
                       and head over 4 images of 256-416 pixels, then per
                       image the boxes over a score threshold the data
                       decides, decoded, sorted and pruned by a greedy
                       non-maximum suppression written in torch
  dlrm_recsys          training steps (Adagrad) of a DLRM-style recommender:
                       8 EmbeddingBag tables of 20,000-100,000 rows (sum
                       pooling over bags of 1-40 ids), a bottom and a top MLP
                       and pairwise feature interactions, batches of 64-512
  conformer_ctc        training steps (AdamW) of a 4-block Conformer encoder
                       (feed-forward halves, self-attention, a depthwise
                       convolution module) with CTC loss, batches of 2-8
                       utterances of 200-800 frames padded per batch
  swin_windows         inference of a Swin-style image transformer: shifted
                       7x7 window attention with patch merging over 3 stages,
                       batch 1-4, input 224 or 448 pixels
  vae_train            training steps (Adam) of a convolutional variational
                       autoencoder (3 stride-2 levels of 32-128 channels down
                       to an 8-channel latent grid, reparameterised sample,
                       upsampling decoder; reconstruction + KL loss), batches
                       of 2-8 images of 64-160 pixels
  ssm_chunked_scan     training steps (AdamW) of a 4-layer Mamba-2-style
                       selective state-space language model: input-dependent
                       step, B and C, the scan run by a Python loop over
                       chunks of 128 steps carrying the state; sequences of
                       96-1,000 tokens (batch 1-4), so the last chunk's
                       length varies
  pointnet_grouping    training steps (Adam) of a PointNet++-style classifier:
                       farthest point sampling in a Python loop, then every
                       point within a radius of a centroid grouped (no cap:
                       the clouds' clusters decide the pair counts), a shared
                       MLP and a scatter max, two levels; 2-8 clouds of
                       1,024-4,096 points
  early_exit_depths    inference of a 6-block encoder classifier with
                       mixture-of-depths routing (only the tokens whose router
                       weight passes 0.5 go through a block's MLP) and early
                       exit (after each block, the samples whose exit head is
                       over 0.9 sure leave the batch); batches of 4-32
                       sequences of 32-256 tokens, padded
  speculative_decoding speculative sampling with a KV cache: a 2-layer draft
                       decoder proposes 3-6 tokens one at a time, a 6-layer
                       target verifies them in one pass and keeps those that
                       pass the acceptance test (how many, the two models'
                       probabilities decide), both caches cut back to what was
                       kept; 3 requests, batch 1, prompts of 16-300 tokens,
                       16-32 new tokens
  neural_ode_adaptive  training steps (Adam) of a neural ODE classifier whose
                       solver is an adaptive Bogacki-Shampine 3(2) written in
                       torch: the number of steps taken (kept for backward)
                       and retried is what the error control and the learned
                       field decide; batches of 64-1,024 of differently spread
                       inputs
  two_tower_retrieval  training steps (Adam) of a two-tower retriever (query
                       and item towers over bags of ids, an item id table of
                       100,000 rows) with a listwise softmax over ragged
                       candidate lists of 5-100 items a query, batches of
                       32-256 queries, and every third step retrieval of a top
                       100 over 24,576 items encoded in chunks
  rnnt_transducer      training steps (AdamW) of an RNN-T: a 4x-subsampled
                       2-layer LSTM encoder, an LSTM prediction network, the
                       (batch, frames, labels + 1, 128) joint tensor and the
                       transducer loss's forward variable run over the
                       lattice's anti-diagonals in a Python loop; batches of
                       2-8 utterances of 160-800 frames and 4-50 labels, each
                       ending at its own cell
  beam_search_shrinking beam search (beam 4-8) with a 6-layer cached decoder:
                       every step the surviving hypotheses' KV caches are
                       copied by index_select from their parents, and the
                       beam shrinks as hypotheses end (when, a length bias and
                       the scores decide); 4 requests, prompts of 16-200
                       tokens, up to 24-48 new tokens
  perceiver_bytes      training steps (AdamW) of a Perceiver IO over bytes: 256
                       latents cross-attend to 256-8,192 padded input bytes,
                       4 latent self-attention blocks, one query per input
                       byte reads the latents back for a masked-byte loss;
                       batches of 1-8 under a budget of 16,384 bytes
  packed_lm_varlen     training steps (AdamW) of a 4-layer language model on
                       packed rows: documents of long-tailed lengths packed
                       to 512-2,048 tokens, projections over the whole row,
                       causal attention one document at a time (split by
                       their lengths, as varlen attention does)
  gan_gradient_penalty WGAN-GP training: a DCGAN-style generator and a critic,
                       each with its own Adam; critic steps with a gradient
                       penalty (create_graph, so a double backward) until the
                       penalty is small (2-6 steps), then a generator step;
                       batches of 16-64 images of 64 pixels
  tabular_ft_transformer training steps (AdamW) of an FT-Transformer: 12
                       numeric features each scaling its own vector, 40
                       categorical columns each with its own embedding table
                       of 2-8,192 rows, 3 attention layers over the 53
                       feature tokens; batches of 64-512 rows
  seg_unet_dice        training steps (Adam) of a 3-level segmentation U-Net
                       on random rectangular crops of 96-320 pixels a side
                       (batch 1-8 under a pixel budget), cross entropy plus a
                       dice loss over only the classes the crop holds
  clip_contrastive     training steps (AdamW) of a CLIP-style pair of towers:
                       a convolutional image tower over 64-pixel images, a
                       4-layer causal text transformer over captions of
                       long-tailed lengths (padded to the batch's longest,
                       each read at its end-of-text token), a learned
                       temperature and the symmetric contrastive loss over
                       the batch x batch similarities; batches of 32-96 pairs
  video_r2plus1d       training steps (SGD with momentum) of an R(2+1)D video
                       classifier: (1, 3, 3) spatial and (3, 1, 1) temporal
                       convolutions in 4 residual blocks of 32-192 channels,
                       3 of them striding time and space; clips of 8-32
                       frames cropped to 80-112 pixels, 1-4 a batch under a
                       budget of pixels
  detr_set_matching    training steps (AdamW) of a DETR-style set detector: a
                       stride-16 convolutional backbone, a 3-layer encoder
                       over the grid of images of 160-384 pixels a side
                       (padded to the batch's largest, the padding masked), 50
                       object queries through 3 decoder layers, every layer's
                       predictions matched one to one with the image's 1-30
                       objects by the Hungarian algorithm (scipy's
                       linear_sum_assignment) for its loss (class, L1 and
                       generalized IoU); batches of 2-4 images
  wavenet_vocoder      a WaveNet vocoder generating mu-law samples one at a
                       time as fast WaveNet does: 10 gated layers of dilation
                       1-512, each keeping a queue of its past inputs, every
                       layer's mel conditioning computed for the whole
                       utterance first; 3 requests of 1-4 utterances of 2-6
                       frames (32 samples a frame), each utterance leaving
                       the batch when its samples are made (the others'
                       queues and conditioning copied out by index)
  lora_grad_accum      LoRA fine-tuning (AdamW over the adapters only) of a
                       frozen 6-layer decoder language model: rank-8 adapters
                       on the attention projections and the MLP, 4 optimizer
                       steps each accumulating gradients over 2-4
                       micro-batches of 1-4 sequences of long-tailed lengths
                       (16-1,024 tokens) padded to the micro-batch's longest,
                       under a budget of 2,048 tokens
  particle_gns_rollout a learned particle simulator (encode-process-decode
                       graph network, 5 message-passing steps over the radius
                       graph of the particles) on 3 scenes of 1-3 blocks of
                       falling particles: 2 training steps (SGD with
                       momentum) on noised positions, then a rollout of 10-20
                       steps in which each step's positions (kept in double)
                       make the next step's radius graph, so the edge count
                       drifts step by step
  tacotron_tts         training steps (Adam) of a Tacotron 2-style
                       text-to-speech model with teacher forcing: a
                       convolutional and bidirectional LSTM text encoder over
                       16-120 symbols, an autoregressive decoder run by a
                       Python loop over as many steps as the batch's longest
                       mel (2 frames a step, location-sensitive attention, a
                       stop logit a step), a convolutional postnet; batches of
                       2-8 utterances
  mae_random_masking   masked-autoencoder pretraining (AdamW): a 6-layer
                       encoder over only the patches a random mask leaves
                       visible (a mask ratio of 0.4-0.9 a step, the kept
                       patches gathered by sorting noise), a 2-layer decoder
                       over all positions with mask tokens put back; images of
                       96-224 pixels, 32-64 a batch under a budget of 6,272
                       patches

They live in tests/data/heldout/, not among the package's examples, so
that placement tuned on the examples is judged on them and not on itself:
the first five were recorded before any placement change of issue 42, the
next four after the placement changes then in the code and before any was
judged or tuned on them, the next three as a fresh sealed set once an earlier one
was to be diagnosed, before any allocator ran on them, the next seven as
another sealed set, committed before any allocator ran on them, the next
four as a third sealed set, likewise, and the last four (lora_grad_accum,
particle_gns_rollout, tacotron_tts, mae_random_masking) as a fourth sealed
set, likewise.  Each of the last twenty-two seeds torch and random itself, so
it records the same trace alone or with the others.
Needs torch (2.13.0 CPU was used), and scipy for detr_set_matching's matching:
python scripts/record_heldout_traces.py [NAME ...]
records the families named (all of them when none is), so a new family is
recorded without rewriting the others' files.
"""
import gzip
import os
import random
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from record_traces import memory_events, to_csv  # noqa: E402  (the shipped traces' recording)

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "heldout")


class GraphConv(nn.Module):
    """h' = relu(W [h, mean of neighbours' h]): messages gathered by edge,
    summed into their targets with index_add, divided by the degree."""

    def __init__(self, cin, cout):
        super().__init__()
        self.lin = nn.Linear(2 * cin, cout)

    def forward(self, h, src, dst, degree):
        agg = torch.zeros_like(h).index_add_(0, dst, h[src]) / degree
        return torch.relu(self.lin(torch.cat((h, agg), 1)))


def gnn_message_passing():
    layers = [GraphConv(64, 128), GraphConv(128, 128), GraphConv(128, 64)]
    rng = random.Random(101)
    graphs = [(rng.randint(200, 3000), rng.randint(3, 12)) for _ in range(12)]
    made = []
    for nodes, per_node in graphs:  # graphs made before recording, as weights are
        edges = nodes * per_node
        src, dst = torch.randint(0, nodes, (edges,)), torch.randint(0, nodes, (edges,))
        degree = torch.bincount(dst, minlength=nodes).clamp(min=1).unsqueeze(1).float()
        made.append((torch.randn(nodes, 64), src, dst, degree))

    def run():
        with torch.no_grad():
            for x, src, dst, degree in made:
                h = x
                for layer in layers:
                    h = layer(h, src, dst, degree)
                h.mean(0)
    return run


def nms(boxes, scores, threshold):
    """Greedy non-maximum suppression: keep the best box, drop those that
    overlap it by more than threshold, repeat."""
    order = scores.argsort(descending=True)
    boxes = boxes[order]
    keep = []
    alive = torch.ones(len(boxes), dtype=torch.bool)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    for i in range(len(boxes)):
        if not alive[i]:
            continue
        keep.append(i)
        lt = torch.maximum(boxes[i, :2], boxes[i + 1:, :2])
        rb = torch.minimum(boxes[i, 2:], boxes[i + 1:, 2:])
        inter = (rb - lt).clamp(min=0).prod(1)
        iou = inter / (area[i] + area[i + 1:] - inter)
        alive[i + 1:] &= iou <= threshold
        if len(keep) >= 100:
            break
    return order[torch.tensor(keep, dtype=torch.long)]


def detector_boxes():
    def stage(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
    backbone = nn.Sequential(stage(3, 32), stage(32, 64), stage(64, 128), stage(128, 256)).eval()
    anchors, classes = 3, 20
    head = nn.Conv2d(256, anchors * (4 + 1 + classes), 1).eval()
    sizes = (256, 416, 320, 384)

    def run():
        with torch.no_grad():
            for res in sizes:
                out = head(backbone(torch.randn(1, 3, res, res)))
                out = out.view(anchors, 4 + 1 + classes, -1).permute(0, 2, 1).reshape(-1, 25)
                score = out[:, 4].sigmoid() * out[:, 5:].softmax(-1).max(-1).values
                picked = (score > score.quantile(0.8)).nonzero().squeeze(1)  # the data decides
                box = out[picked, :4]
                xy, wh = box[:, :2].sigmoid() * res, box[:, 2:].exp() * 16
                boxes = torch.cat((xy - wh / 2, xy + wh / 2), 1)
                nms(boxes, score[picked], 0.5)
    return run


def dlrm_recsys():
    rows = (100000, 60000, 40000, 20000, 80000, 30000, 50000, 25000)
    dim = 32
    tables = [nn.EmbeddingBag(n, dim, mode="sum") for n in rows]
    bottom = nn.Sequential(nn.Linear(13, 128), nn.ReLU(), nn.Linear(128, dim), nn.ReLU())
    pairs = (len(rows) + 1) * len(rows) // 2
    top = nn.Sequential(nn.Linear(dim + pairs, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(),
                        nn.Linear(64, 1))
    params = [p for m in (*tables, bottom, top) for p in m.parameters()]
    opt = torch.optim.Adagrad(params, lr=0.01)
    rng = random.Random(103)
    batches = [rng.choice((64, 128, 256, 512)) for _ in range(10)]
    iu = torch.triu_indices(len(rows) + 1, len(rows) + 1, 1)

    def run():
        for batch in batches:
            dense = bottom(torch.randn(batch, 13))
            feats = [dense]
            for table, n in zip(tables, rows):
                lengths = torch.randint(1, 41, (batch,))
                ids = torch.randint(0, n, (int(lengths.sum()),))
                offsets = torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]))
                feats.append(table(ids, offsets))
            z = torch.stack(feats, 1)
            inter = torch.bmm(z, z.transpose(1, 2))[:, iu[0], iu[1]]
            logit = top(torch.cat((dense, inter), 1)).squeeze(1)
            loss = nn.functional.binary_cross_entropy_with_logits(logit,
                                                                  torch.rand(batch).round())
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


class ConformerBlock(nn.Module):
    """Half feed-forward, self-attention, convolution module (pointwise,
    GLU, depthwise, batch norm, swish, pointwise), half feed-forward."""

    def __init__(self, d, heads, kernel=15):
        super().__init__()

        def ff():
            return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        self.ff1, self.ff2 = ff(), ff()
        self.norm_att, self.att = nn.LayerNorm(d), nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm_conv = nn.LayerNorm(d)
        self.pw1, self.dw = nn.Conv1d(d, 2 * d, 1), nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d)
        self.bn, self.pw2 = nn.BatchNorm1d(d), nn.Conv1d(d, d, 1)
        self.out = nn.LayerNorm(d)

    def forward(self, x, pad):
        x = x + 0.5 * self.ff1(x)
        a = self.norm_att(x)
        x = x + self.att(a, a, a, key_padding_mask=pad, need_weights=False)[0]
        c = nn.functional.glu(self.pw1(self.norm_conv(x).transpose(1, 2)), 1)
        c = self.pw2(nn.functional.silu(self.bn(self.dw(c))))
        x = x + c.transpose(1, 2)
        return self.out(x + 0.5 * self.ff2(x))


def conformer_ctc():
    d, vocab = 144, 128
    sub = nn.Sequential(nn.Conv2d(1, d, 3, 2), nn.ReLU(), nn.Conv2d(d, d, 3, 2), nn.ReLU())
    proj = nn.Linear(d * 19, d)
    blocks = nn.ModuleList(ConformerBlock(d, 4) for _ in range(4))
    head = nn.Linear(d, vocab)
    params = [p for m in (sub, proj, blocks, head) for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    rng = random.Random(107)
    batches = [[rng.randint(200, 800) for _ in range(rng.choice((2, 4, 8)))] for _ in range(6)]

    def run():
        for frames in batches:
            t = max(frames)
            x = sub(torch.randn(len(frames), 1, t, 80))  # 80 mel bins -> 19 after two stride-2 convs
            b, c, tt, f = x.shape
            x = proj(x.permute(0, 2, 1, 3).reshape(b, tt, c * f))
            lengths = torch.tensor([(n - 3) // 4 for n in frames])
            pad = torch.arange(tt).unsqueeze(0) >= lengths.unsqueeze(1)
            for block in blocks:
                x = block(x, pad)
            logp = head(x).log_softmax(-1).transpose(0, 1)
            targets = torch.randint(1, vocab, (b, 40))
            loss = nn.functional.ctc_loss(logp, targets, lengths, torch.full((b,), 40))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


class WindowBlock(nn.Module):
    """Swin's block: attention inside 7x7 windows, shifted by half a window
    every other block (torch.roll), then an MLP."""

    def __init__(self, d, heads, shift):
        super().__init__()
        self.shift, self.heads = shift, heads
        self.n1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.n2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, h, w, d = x.shape
        y = self.n1(x)
        if self.shift:
            y = torch.roll(y, (-3, -3), (1, 2))
        win = y.view(b, h // 7, 7, w // 7, 7, d).permute(0, 1, 3, 2, 4, 5).reshape(-1, 49, d)
        q, k, v = self.qkv(win).view(-1, 49, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(-1, 49, d)
        y = self.proj(att).view(b, h // 7, w // 7, 7, 7, d).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, d)
        if self.shift:
            y = torch.roll(y, (3, 3), (1, 2))
        x = x + y
        return x + self.mlp(self.n2(x))


def swin_windows():
    dims, depths, heads = (96, 192, 384), (2, 2, 4), (3, 6, 12)
    embed = nn.Conv2d(3, dims[0], 4, 4)
    stages, merges = nn.ModuleList(), nn.ModuleList()
    for i, (d, n, hd) in enumerate(zip(dims, depths, heads)):
        stages.append(nn.ModuleList(WindowBlock(d, hd, j % 2 == 1) for j in range(n)))
        if i + 1 < len(dims):
            merges.append(nn.Sequential(nn.LayerNorm(4 * d), nn.Linear(4 * d, dims[i + 1])))
    for m in (embed, stages, merges):
        m.eval()
    rng = random.Random(109)
    shapes = [(rng.choice((1, 2, 4)), rng.choice((224, 448))) for _ in range(6)]

    def run():
        with torch.no_grad():
            for batch, res in shapes:
                x = embed(torch.randn(batch, 3, res, res)).permute(0, 2, 3, 1)
                for i, blocks in enumerate(stages):
                    for block in blocks:
                        x = block(x)
                    if i < len(merges):  # 2x2 neighbours concatenated, halving the grid
                        x = torch.cat((x[:, 0::2, 0::2], x[:, 1::2, 0::2],
                                       x[:, 0::2, 1::2], x[:, 1::2, 1::2]), -1)
                        x = merges[i](x)
                x.mean((1, 2))
    return run


class ConvVAE(nn.Module):
    """A convolutional VAE whose latent is a grid (8 channels at 1/8 of the
    image, as latent-diffusion autoencoders have), so any image size that 8
    divides goes through: stride-2 convolutions down, nearest upsampling and
    convolutions up, group norm and SiLU between."""

    def __init__(self, widths=(32, 64, 128), latent=8):
        super().__init__()

        def block(cin, cout, stride):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.GroupNorm(8, cout), nn.SiLU(),
                                 nn.Conv2d(cout, cout, 3, 1, 1), nn.GroupNorm(8, cout), nn.SiLU())
        down, cin = [], 3
        for w in widths:
            down.append(block(cin, w, 2))
            cin = w
        self.encoder = nn.Sequential(*down, nn.Conv2d(cin, 2 * latent, 1))
        up = [nn.Conv2d(latent, cin, 3, 1, 1)]
        for w in reversed(widths):
            up += [nn.Upsample(scale_factor=2), block(cin, w, 1)]
            cin = w
        self.decoder = nn.Sequential(*up, nn.Conv2d(cin, 3, 3, 1, 1))

    def forward(self, x):
        mean, logvar = self.encoder(x).chunk(2, 1)
        z = mean + (0.5 * logvar).exp() * torch.randn_like(mean)  # reparameterised sample
        kl = 0.5 * (mean.pow(2) + logvar.exp() - 1 - logvar).mean()
        return self.decoder(z), kl


def vae_train():
    torch.manual_seed(113)
    model = ConvVAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    rng = random.Random(113)
    shapes = [(rng.choice((2, 4, 8)), rng.choice((64, 96, 128, 160))) for _ in range(8)]

    def run():
        for batch, res in shapes:
            x = torch.rand(batch, 3, res, res)
            recon, kl = model(x)
            loss = nn.functional.mse_loss(recon, x) + 1e-3 * kl
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


class ChunkedScanLayer(nn.Module):
    """A Mamba-2-style selective state-space layer: one input projection
    gives the gate z, the input x (through a causal depthwise convolution),
    the input-dependent B, C and step dt; the scan runs chunk by chunk in a
    Python loop, quadratic inside a chunk (decays as a masked matrix) and
    carrying a (heads, head dim, state) state from chunk to chunk."""

    def __init__(self, d, heads=8, state=32, chunk=128):
        super().__init__()
        self.inner, self.heads, self.state, self.chunk = 2 * d, heads, state, chunk
        self.norm = nn.LayerNorm(d)
        self.proj_in = nn.Linear(d, 2 * self.inner + 2 * state + heads)
        self.conv = nn.Conv1d(self.inner, self.inner, 4, padding=3, groups=self.inner)
        self.log_a = nn.Parameter(torch.linspace(0, 2, heads))
        self.skip = nn.Parameter(torch.ones(heads))
        self.proj_out = nn.Linear(self.inner, d)

    def scan(self, x, dt, b_in, c_out):
        """y_t = C_t h_t, h_t = exp(dt_t a) h_{t-1} + dt_t B_t x_t, a chunk at a time."""
        batch, length, heads, hd = x.shape
        a = -self.log_a.exp()
        h = x.new_zeros(batch, heads, hd, self.state)
        ys = []
        for s in range(0, length, self.chunk):
            xc, dc, bc, cc = (t[:, s:s + self.chunk] for t in (x, dt, b_in, c_out))
            n = xc.shape[1]
            cum = (dc * a).cumsum(1)  # (batch, n, heads): log decay from the chunk start
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            decay = (cum.unsqueeze(2) - cum.unsqueeze(1)).masked_fill(~causal[:, :, None], -torch.inf).exp()
            scores = cc @ bc.transpose(1, 2)  # (batch, n, n)
            xdt = xc * dc.unsqueeze(-1)
            y = torch.einsum("bts,btsh,bshp->bthp", scores, decay, xdt)
            y = y + torch.einsum("btn,bhpn->bthp", cc, h) * cum.exp().unsqueeze(-1)
            ys.append(y)
            rest = (cum[:, -1:] - cum).exp()  # decay from each step to the chunk end
            h = h * cum[:, -1].exp()[:, :, None, None] + torch.einsum("bsn,bsh,bshp->bhpn", bc, rest, xdt)
        return torch.cat(ys, 1)

    def forward(self, u):
        batch, length, _ = u.shape
        z, x, b_in, c_out, dt = self.proj_in(self.norm(u)).split(
            (self.inner, self.inner, self.state, self.state, self.heads), -1)
        x = nn.functional.silu(self.conv(x.transpose(1, 2))[..., :length].transpose(1, 2))
        x = x.reshape(batch, length, self.heads, -1)
        y = self.scan(x, nn.functional.softplus(dt), b_in, c_out) + x * self.skip[:, None]
        y = y.reshape(batch, length, self.inner) * nn.functional.silu(z)
        return u + self.proj_out(y)


def ssm_chunked_scan():
    torch.manual_seed(127)
    vocab, d = 4096, 256
    emb = nn.Embedding(vocab, d)
    layers = nn.ModuleList(ChunkedScanLayer(d) for _ in range(4))
    norm = nn.LayerNorm(d)
    params = [p for m in (emb, layers, norm) for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    rng = random.Random(127)
    shapes = []
    for _ in range(6):
        length = rng.randint(96, 1000)
        shapes.append((rng.choice([b for b in (1, 2, 4) if b * length <= 2048] or [1]), length))

    def run():
        for batch, length in shapes:
            tokens = torch.randint(0, vocab, (batch, length + 1))
            x = emb(tokens[:, :-1])
            for layer in layers:
                x = layer(x)
            logits = norm(x) @ emb.weight.t()  # tied embedding
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


def farthest_points(pos, count):
    """Farthest point sampling, one centroid a step (as PointNet++ samples):
    (batch, count) indices into pos (batch, points, 3)."""
    batch, points, _ = pos.shape
    picked = torch.zeros(batch, count, dtype=torch.long)
    nearest = torch.full((batch, points), torch.inf)
    last = torch.zeros(batch, dtype=torch.long)
    rows = torch.arange(batch)
    for i in range(count):
        picked[:, i] = last
        nearest = torch.minimum(nearest, (pos - pos[rows, last].unsqueeze(1)).pow(2).sum(-1))
        last = nearest.argmax(1)
    return picked


class SetAbstraction(nn.Module):
    """PointNet++'s set abstraction without its cap on neighbours: every
    point within radius of a centroid is grouped (a count the cloud's density
    decides), its offset and features go through a shared MLP, and the
    centroid keeps the channel-wise max (scatter_reduce over the pairs)."""

    def __init__(self, centroids, radius, cin, widths):
        super().__init__()
        self.centroids, self.radius = centroids, radius
        layers, c = [], cin + 3
        for w in widths:
            layers += [nn.Linear(c, w), nn.LayerNorm(w), nn.ReLU()]
            c = w
        self.mlp = nn.Sequential(*layers)

    def forward(self, pos, feat):
        batch, points, _ = pos.shape
        with torch.no_grad():
            idx = farthest_points(pos, self.centroids)
            centre = torch.gather(pos, 1, idx.unsqueeze(-1).expand(-1, -1, 3))
            near = torch.cdist(centre, pos) < self.radius  # (batch, centroids, points)
            b, c, p = near.nonzero(as_tuple=True)  # the pairs: how many, the data decides
        grouped = torch.cat((pos[b, p] - centre[b, c], feat[b, p]), 1)
        h = self.mlp(grouped)
        slot = (b * self.centroids + c).unsqueeze(1).expand(-1, h.shape[1])
        out = h.new_zeros(batch * self.centroids, h.shape[1]).scatter_reduce(
            0, slot, h, "amax", include_self=False)
        return centre, out.view(batch, self.centroids, -1)


def clouds(rng, batch, points):
    """Clouds of 2-6 Gaussian clusters of random spread in the unit cube, so
    that neighbour counts vary from cloud to cloud and within one."""
    out = []
    for _ in range(batch):
        k = rng.randint(2, 6)
        which = torch.randint(0, k, (points,))
        centres, spread = torch.rand(k, 3), torch.rand(k, 1) * 0.15 + 0.02
        out.append((centres[which] + torch.randn(points, 3) * spread[which]).clamp(0, 1))
    return torch.stack(out)


def pointnet_grouping():
    torch.manual_seed(131)
    sa1 = SetAbstraction(256, 0.1, 0, (32, 32, 64))
    sa2 = SetAbstraction(64, 0.25, 64, (64, 64, 128))
    head = nn.Sequential(nn.Linear(128 + 3, 256), nn.ReLU(), nn.Linear(256, 40))
    params = [p for m in (sa1, sa2, head) for p in m.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    rng = random.Random(131)
    shapes = [(rng.choice((2, 4, 8)), rng.choice((1024, 2048, 4096))) for _ in range(5)]
    made = [clouds(rng, batch, points) for batch, points in shapes]  # made before recording

    def run():
        for pos in made:
            centre, feat = sa1(pos, pos.new_zeros(*pos.shape[:2], 0))
            centre, feat = sa2(centre, feat)
            logits = head(torch.cat((centre, feat), -1)).max(1).values
            loss = nn.functional.cross_entropy(logits, torch.randint(0, 40, (len(pos),)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


class RoutedBlock(nn.Module):
    """A transformer block whose MLP only the tokens its router picks go
    through (mixture-of-depths with a threshold, as at inference: how many,
    the tokens decide); the others skip it on the residual."""

    def __init__(self, d, heads):
        super().__init__()
        self.att = nn.MultiheadAttention(d, heads, batch_first=True)
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.router = nn.Linear(d, 1)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, pad):
        a = self.n1(x)
        x = x + self.att(a, a, a, key_padding_mask=pad, need_weights=False)[0]
        weight = self.router(x).squeeze(-1).sigmoid()
        picked = ((weight > 0.5) & ~pad).flatten().nonzero().squeeze(1)
        flat = x.reshape(-1, x.shape[-1])
        routed = self.mlp(self.n2(flat[picked])) * weight.flatten()[picked].unsqueeze(1)
        return flat.index_add(0, picked, routed).view_as(x)


def early_exit_depths():
    torch.manual_seed(137)
    vocab, d, classes = 8000, 384, 10
    emb = nn.Embedding(vocab, d)
    blocks = [RoutedBlock(d, 6).eval() for _ in range(6)]
    exits = [nn.Sequential(nn.LayerNorm(d), nn.Linear(d, classes)) for _ in blocks]
    with torch.no_grad():
        for e in exits:  # sharper than at init, so that some samples are sure early, as trained
            e[1].weight.mul_(6)
    rng = random.Random(137)
    shapes = [(rng.choice((4, 8, 16, 32)), rng.choice((32, 64, 128, 256))) for _ in range(10)]

    def run():
        with torch.no_grad():
            for batch, seq in shapes:
                lengths = torch.randint(seq // 4, seq + 1, (batch,))
                pad = torch.arange(seq).unsqueeze(0) >= lengths.unsqueeze(1)
                x = emb(torch.randint(0, vocab, (batch, seq)))
                for block, exit_head in zip(blocks, exits):
                    x = block(x, pad)
                    keep = (~pad).unsqueeze(-1)
                    pooled = (x * keep).sum(1) / keep.sum(1)
                    confident = exit_head(pooled).softmax(-1).max(-1).values > 0.9
                    stay = (~confident).nonzero().squeeze(1)  # the rest leave the batch here
                    if len(stay) == 0:
                        break
                    x, pad = x[stay], pad[stay]
    return run


class CachedDecoder(nn.Module):
    """A pre-norm decoder whose keys and values are kept per layer, as
    (rows, heads, length, head dim), and grown by torch.cat; forward(tokens,
    cache) runs the new tokens of every row over its cached prefix (causal
    among themselves) and returns logits and the longer cache."""

    def __init__(self, vocab, d, layers, heads):
        super().__init__()
        self.heads = heads
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(2048, d)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            n1=nn.LayerNorm(d), qkv=nn.Linear(d, 3 * d), proj=nn.Linear(d, d), n2=nn.LayerNorm(d),
            mlp=nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))))
            for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, tokens, cache):
        past = cache[0][0].shape[2] if cache else 0
        (rows, n), d = tokens.shape, self.emb.embedding_dim
        x = self.emb(tokens) + self.pos(torch.arange(past, past + n))
        mask = torch.ones(n, past + n, dtype=torch.bool).tril(past)
        grown = []
        for i, blk in enumerate(self.blocks):
            q, k, v = blk["qkv"](blk["n1"](x)).view(rows, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            if cache:
                k, v = torch.cat((cache[i][0], k), 2), torch.cat((cache[i][1], v), 2)
            grown.append((k, v))
            att = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + blk["proj"](att.transpose(1, 2).reshape(rows, n, d))
            x = x + blk["mlp"](blk["n2"](x))
        return self.head(self.norm(x)), grown


def truncated(cache, length):
    """The cache cut back to its first length positions (rejected drafts dropped)."""
    return [(k[:, :, :length], v[:, :, :length]) for k, v in cache]


def speculative_decoding():
    torch.manual_seed(139)
    vocab = 8000
    target = CachedDecoder(vocab, 512, 6, 8).eval()
    draft = CachedDecoder(vocab, 256, 2, 4).eval()
    rng = random.Random(139)
    requests = [(rng.randint(16, 300), rng.randint(16, 32), rng.choice((3, 4, 6))) for _ in range(3)]

    def run():
        with torch.no_grad():
            for prompt_len, new, k in requests:
                prompt = torch.randint(0, vocab, (1, prompt_len))
                t_cache = truncated(target(prompt, None)[1], prompt_len - 1)
                _, d_cache = draft(prompt[:, :-1], None)
                last, length, made = prompt[:, -1:], prompt_len, 0
                while made < new:  # draft k tokens, verify them in one target pass
                    proposed, q_probs, tok = [], [], last
                    for _ in range(k):
                        d_logits, d_cache = draft(tok, d_cache)
                        q = d_logits[0, -1].softmax(-1)
                        tok = torch.multinomial(q, 1).view(1, 1)
                        proposed.append(tok)
                        q_probs.append(q)
                    block = torch.cat([last] + proposed, 1)
                    v_logits, t_cache = target(block, t_cache)
                    p = v_logits[0].softmax(-1)  # (k + 1, vocab)
                    accepted = 0
                    for j in range(k):  # accept draft j with probability min(1, p/q)
                        x = proposed[j].item()
                        if torch.rand(()) * q_probs[j][x] > p[j, x]:
                            break
                        accepted += 1
                    if accepted < k:  # resample from the residual
                        residual = (p[accepted] - q_probs[accepted]).clamp(min=0)
                        nxt = torch.multinomial(residual / residual.sum(), 1).view(1, 1)
                    else:  # all taken: the draft has not seen its last one yet
                        nxt = torch.multinomial(p[k], 1).view(1, 1)
                        d_cache = draft(proposed[-1], d_cache)[1]
                    length += accepted + 1
                    made += accepted + 1
                    t_cache = truncated(t_cache, length - 1)
                    d_cache = truncated(d_cache, length - 1)
                    last = nxt
    return run


class ODEFunc(nn.Module):
    """dh/dt = f(h, t): an MLP that sees the time as an extra input."""

    def __init__(self, d, hidden):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d + 1, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                 nn.Tanh(), nn.Linear(hidden, d))

    def forward(self, t, h):
        return self.net(torch.cat((h, t.expand(len(h), 1)), 1))


def adaptive_solve(f, h, t0=0.0, t1=1.0, rtol=1e-4, atol=1e-4):
    """Bogacki-Shampine 3(2) with step-size control: a step is taken when
    its error estimate is within tolerance, else retried shorter; the steps
    taken (and kept for backward) and the retries are what the dynamics
    decide.  Returns h(t1)."""
    t, step = t0, 0.05
    k1 = f(torch.tensor(t), h)
    while t < t1 - 1e-9:
        step = min(step, t1 - t)
        k2 = f(torch.tensor(t + step / 2), h + step / 2 * k1)
        k3 = f(torch.tensor(t + 3 * step / 4), h + 3 * step / 4 * k2)
        new = h + step * (2 * k1 + 3 * k2 + 4 * k3) / 9
        k4 = f(torch.tensor(t + step), new)
        err = step * (-5 * k1 / 72 + k2 / 12 + k3 / 9 - k4 / 8)
        scale = atol + rtol * torch.maximum(h.abs(), new.abs())
        ratio = (err / scale).pow(2).mean().sqrt().item()
        if ratio <= 1:  # taken; k4 is the next step's k1 (first same as last)
            t, h, k1 = t + step, new, k4
        step *= min(5.0, max(0.2, 0.9 * ratio ** (-1 / 3) if ratio > 0 else 5.0))
    return h


def neural_ode_adaptive():
    torch.manual_seed(149)
    d, classes = 64, 10
    encoder = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, d))
    func = ODEFunc(d, 512)
    with torch.no_grad():  # a steeper field than at init, so that the solver has to work
        for layer in func.net[::2]:
            layer.weight.mul_(3)
    head = nn.Linear(d, classes)
    params = [p for m in (encoder, func, head) for p in m.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3)
    rng = random.Random(149)
    shapes = [(rng.choice((64, 128, 256, 512, 1024)), rng.choice((0.5, 1.0, 2.0, 4.0)))
              for _ in range(8)]

    def run():
        for batch, spread in shapes:  # wider inputs, stiffer dynamics, more steps
            x = torch.randn(batch, 32) * spread
            h = adaptive_solve(func, encoder(x))
            loss = nn.functional.cross_entropy(head(h), torch.randint(0, classes, (batch,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


class Tower(nn.Module):
    """One side of a two-tower retriever: the mean of bags of ids (and an id
    of its own, for items) through an MLP to a unit vector."""

    def __init__(self, bag_rows, own_rows=0, d=64, out=128):
        super().__init__()
        self.bag = nn.EmbeddingBag(bag_rows, d, mode="mean")
        self.own = nn.Embedding(own_rows, d) if own_rows else None
        self.mlp = nn.Sequential(nn.Linear(2 * d if own_rows else d, 256), nn.ReLU(), nn.Linear(256, out))

    def forward(self, ids, offsets, own=None):
        x = self.bag(ids, offsets)
        if self.own is not None:
            x = torch.cat((x, self.own(own)), 1)
        return nn.functional.normalize(self.mlp(x), dim=1)


def bags(lengths, rows):
    """Random ids for bags of the given lengths, and their offsets."""
    offsets = torch.cat((torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]))
    return torch.randint(0, rows, (int(lengths.sum()),)), offsets


def two_tower_retrieval():
    torch.manual_seed(151)
    words, items, tags = 50000, 100000, 20000
    query, item = Tower(words), Tower(tags, items)
    opt = torch.optim.Adam([*query.parameters(), *item.parameters()], lr=1e-3)
    rng = random.Random(151)
    batches = [rng.choice((32, 64, 128, 256)) for _ in range(9)]

    def encode_items(ids):
        return item(*bags(torch.randint(1, 11, (len(ids),)), tags), ids)

    def run():
        for step, batch in enumerate(batches):
            q = query(*bags(torch.randint(2, 31, (batch,)), words))
            # each query's candidate list (its positive first), of a length the log decides
            counts = torch.randint(5, 101, (batch,))
            owner = torch.repeat_interleave(torch.arange(batch), counts)
            cands = encode_items(torch.randint(0, items, (len(owner),)))
            score = (q[owner] * cands).sum(1) / 0.05
            top = score.new_full((batch,), -torch.inf).scatter_reduce(0, owner, score, "amax")
            norm = top + torch.zeros(batch).index_add(0, owner, (score - top[owner]).exp()).log()
            first = counts.cumsum(0) - counts
            loss = (norm - score[first]).mean()  # listwise softmax, the positive first
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 3 == 2:  # retrieval: the corpus in chunks, a running top 100
                with torch.no_grad():
                    q = query(*bags(torch.randint(2, 31, (batch,)), words))
                    best = torch.empty(batch, 0)
                    for start in range(0, 24576, 4096):
                        s = q @ encode_items(torch.arange(start, start + 4096)).t()
                        best = torch.cat((best, s), 1).topk(100, 1).values
    return run


class Transducer(nn.Module):
    """RNN-T: a convolution-subsampled (4x) LSTM encoder over audio frames, an
    LSTM prediction network over the labels so far (blank first) and a joint
    network over every (frame, label) pair, giving log-probabilities of shape
    (batch, frames, labels + 1, vocabulary)."""

    def __init__(self, mels=80, d=256, vocab=128, joint=256):
        super().__init__()
        self.sub = nn.Sequential(nn.Conv1d(mels, d, 3, 2, 1), nn.ReLU(), nn.Conv1d(d, d, 3, 2, 1), nn.ReLU())
        self.enc = nn.LSTM(d, d, 2, batch_first=True)
        self.emb, self.pred = nn.Embedding(vocab, d), nn.LSTM(d, d, 1, batch_first=True)
        self.enc_out, self.pred_out = nn.Linear(d, joint), nn.Linear(d, joint)
        self.out = nn.Linear(joint, vocab)

    def forward(self, feats, labels):
        enc = self.enc_out(self.enc(self.sub(feats.transpose(1, 2)).transpose(1, 2))[0])
        pred = self.pred_out(self.pred(self.emb(nn.functional.pad(labels, (1, 0))))[0])  # blank = 0 first
        return self.out(torch.tanh(enc.unsqueeze(2) + pred.unsqueeze(1))).log_softmax(-1)


def transducer_loss(logp, labels, frames, label_lengths):
    """-log P(labels | frames) over all alignments: the forward variable on
    the (frame, label) lattice, one anti-diagonal at a time (a cell needs
    only the diagonal before), each kept for backward; the blank and label
    log-probabilities are sheared onto the diagonals first, and every
    utterance reads its own end cell (frames - 1, label length)."""
    batch, t_max, u1, _ = logp.shape
    blank = logp[..., 0]  # (batch, T, U + 1)
    emit = logp[:, :, :-1].gather(3, labels[:, None, :, None].expand(-1, t_max, -1, 1)).squeeze(3)
    u, never = torch.arange(u1), -1e4
    t = torch.arange(t_max + u1 - 1).unsqueeze(1) - u  # (diagonal, u): the frame of cell (t, u)
    inside = (t >= 0) & (t < t_max)
    into_blank = torch.where(inside & (t >= 1), blank[:, (t - 1).clamp(0, t_max - 1), u], never)
    into_emit = torch.where(inside[:, 1:], emit[:, t[:, 1:].clamp(0, t_max - 1), u[:-1]], never)
    alpha = torch.full((batch, u1), never)
    alpha[:, 0] = 0
    diagonals = [alpha]
    for n in range(1, t_max + u1 - 1):  # cell (t, u) on diagonal n = t + u
        emitted = nn.functional.pad(alpha[:, :-1] + into_emit[:, n], (1, 0), value=never)
        alpha = torch.logaddexp(alpha + into_blank[:, n], emitted)
        diagonals.append(alpha)
    ends = [diagonals[f - 1 + n][b, n] + blank[b, f - 1, n]
            for b, (f, n) in enumerate(zip(frames, label_lengths))]
    return -torch.stack(ends).mean()


def rnnt_transducer():
    torch.manual_seed(157)
    vocab = 128
    model = Transducer(vocab=vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = random.Random(157)
    batches = []
    for _ in range(5):
        batch = rng.choice((2, 4, 8))
        frames = [rng.randint(160, 800) for _ in range(batch)]
        labels = [rng.randint(max(4, f // 40), f // 16) for f in frames]
        while batch * ((max(frames) + 3) // 4) * (max(labels) + 1) > 40000:  # the joint's bound
            batch -= 1
            frames, labels = frames[:batch], labels[:batch]
        batches.append((frames, labels))

    def run():
        for frames, label_lengths in batches:
            sub = [(f + 3) // 4 for f in frames]  # two stride-2 convolutions
            labels = torch.randint(1, vocab, (len(frames), max(label_lengths)))
            logp = model(torch.randn(len(frames), max(frames), 80), labels)
            loss = transducer_loss(logp, labels, sub, label_lengths)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


def beam_search_shrinking():
    torch.manual_seed(163)
    vocab, eos = 8000, 0
    model = CachedDecoder(vocab, 384, 6, 6).eval()
    with torch.no_grad():  # sharper than at init, as trained, so hypotheses differ in when they end
        model.head.weight.mul_(4)
    rng = random.Random(163)
    requests = [(rng.randint(16, 200), rng.choice((4, 6, 8)), rng.randint(24, 48)) for _ in range(4)]

    def run():
        with torch.no_grad():
            for prompt_len, beam, most in requests:
                logits, cache = model(torch.randint(1, vocab, (1, prompt_len)), None)
                logits = logits[:, -1]
                scores, finished = torch.zeros(1), 0
                for step in range(most):
                    # an end-of-sequence bias growing with length stands in for a
                    # trained model's stopping: when each hypothesis ends, the
                    # scores decide
                    logits[:, eos] += 0.3 * step - 2
                    live = beam - finished
                    total = (scores.unsqueeze(1) + logits.log_softmax(-1)).flatten()
                    top, idx = total.topk(min(2 * live, len(total)))
                    ended = (idx[:live] % vocab == eos).sum().item()  # finished among the best
                    finished += ended
                    go = (idx % vocab != eos).nonzero().squeeze(1)[:beam - finished]
                    if finished >= beam or len(go) == 0:
                        break
                    parents, tokens = idx[go] // vocab, idx[go] % vocab
                    scores = top[go]
                    # every surviving hypothesis takes its parent's cache: a copy
                    # each step, of as many rows as hypotheses are live
                    cache = [(k.index_select(0, parents), v.index_select(0, parents)) for k, v in cache]
                    logits, cache = model(tokens.unsqueeze(1), cache)
                    logits = logits[:, -1]
    return run


class Perceiver(nn.Module):
    """Perceiver IO over bytes: a fixed array of latents cross-attends to
    the inputs (padding masked), latent self-attention blocks, and one query
    per input position cross-attends back to the latents for its logits."""

    def __init__(self, latents=256, d=256, blocks=4, heads=8, most=8192):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(latents, d) * 0.02)
        self.emb, self.pos = nn.Embedding(256, d), nn.Embedding(most, d)
        self.n_in, self.n_lat = nn.LayerNorm(d), nn.LayerNorm(d)
        self.read = nn.MultiheadAttention(d, 1, batch_first=True)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(d, heads, 4 * d, 0.0, batch_first=True,
                                                               norm_first=True) for _ in range(blocks))
        self.write = nn.MultiheadAttention(d, 1, batch_first=True)
        self.out = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 256))

    def forward(self, data, pad):
        batch, length = data.shape
        where = self.pos(torch.arange(length)).expand(batch, -1, -1)
        x = self.n_in(self.emb(data) + where)
        lat = self.latents.expand(batch, -1, -1)
        lat = lat + self.read(self.n_lat(lat), x, x, key_padding_mask=pad, need_weights=False)[0]
        for block in self.blocks:
            lat = block(lat)
        return self.out(self.write(where, lat, lat, need_weights=False)[0])


def perceiver_bytes():
    torch.manual_seed(167)
    model = Perceiver()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    rng = random.Random(167)
    batches = []
    for _ in range(8):
        lengths = [int(2 ** rng.uniform(8, 13)) for _ in range(rng.choice((1, 2, 4, 8)))]
        while len(lengths) * max(lengths) > 16384:  # a token budget a batch
            lengths.pop()
        batches.append(lengths)

    def run():
        for lengths in batches:
            length = max(lengths)
            pad = torch.arange(length).unsqueeze(0) >= torch.tensor(lengths).unsqueeze(1)
            data = torch.randint(0, 256, (len(lengths), length))
            masked = (torch.rand(len(lengths), length) < 0.15) & ~pad  # masked-byte loss
            logits = model(data.masked_fill(masked, 0), pad)
            loss = nn.functional.cross_entropy(logits[masked], data[masked])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


class PackedBlock(nn.Module):
    """A causal transformer block over a packed row of documents: the
    projections run over every token at once, attention one document at a
    time (the cumulative lengths split the row, as varlen attention does)."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.n1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.n2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, lengths):
        n, d = x.shape
        qkv = self.qkv(self.n1(x)).view(n, 3, self.heads, -1).permute(1, 2, 0, 3)  # (3, heads, n, hd)
        outs = [nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                for q, k, v in zip(*(t.split(lengths, 1) for t in qkv))]
        x = x + self.proj(torch.cat(outs, 1).transpose(0, 1).reshape(n, d))
        return x + self.mlp(self.n2(x))


def packed_lm_varlen():
    torch.manual_seed(173)
    vocab, d = 4096, 256
    emb, pos = nn.Embedding(vocab, d), nn.Embedding(2048, d)
    blocks = nn.ModuleList(PackedBlock(d, 4) for _ in range(4))
    norm = nn.LayerNorm(d)
    params = [p for m in (emb, pos, blocks, norm) for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-4)
    rng = random.Random(173)
    steps = []
    for _ in range(6):  # documents of a long-tailed length packed to a token budget, the last cut
        budget, lengths = rng.choice((512, 1024, 2048)), []
        while sum(lengths) < budget:
            lengths.append(min(int(rng.lognormvariate(4.5, 1.0)) + 8, budget - sum(lengths)))
        steps.append(lengths)

    def run():
        for lengths in steps:
            tokens = torch.randint(0, vocab, (sum(lengths) + 1,))
            positions = torch.cat([torch.arange(n) for n in lengths])  # restart at each document
            x = emb(tokens[:-1]) + pos(positions)
            for block in blocks:
                x = block(x, lengths)
            logits = norm(x) @ emb.weight.t()  # tied embedding
            loss = nn.functional.cross_entropy(logits, tokens[1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


def gan_gradient_penalty():
    torch.manual_seed(179)
    z_dim = 128
    gen = nn.Sequential(
        nn.Linear(z_dim, 256 * 4 * 4), nn.Unflatten(1, (256, 4, 4)), nn.BatchNorm2d(256), nn.ReLU(),
        nn.ConvTranspose2d(256, 128, 4, 2, 1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.ConvTranspose2d(32, 3, 4, 2, 1), nn.Tanh())  # 64 x 64
    critic = nn.Sequential(
        nn.Conv2d(3, 32, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(32, 64, 4, 2, 1), nn.GroupNorm(8, 64),
        nn.LeakyReLU(0.2), nn.Conv2d(64, 128, 4, 2, 1), nn.GroupNorm(8, 128), nn.LeakyReLU(0.2),
        nn.Conv2d(128, 256, 4, 2, 1), nn.GroupNorm(8, 256), nn.LeakyReLU(0.2), nn.Flatten(),
        nn.Linear(256 * 4 * 4, 1))
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-4, betas=(0.0, 0.9))
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))
    rng = random.Random(179)
    batches = [rng.choice((16, 32, 64)) for _ in range(4)]

    def run():
        for batch in batches:
            for step in range(6):  # the critic trains until its penalty is small (2-6 steps)
                real = torch.rand(batch, 3, 64, 64) * 2 - 1
                with torch.no_grad():
                    fake = gen(torch.randn(batch, z_dim))
                mix = torch.rand(batch, 1, 1, 1)
                between = (mix * real + (1 - mix) * fake).requires_grad_()
                grad, = torch.autograd.grad(critic(between).sum(), between, create_graph=True)
                penalty = (grad.flatten(1).norm(dim=1) - 1).pow(2).mean()
                loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
                opt_c.zero_grad()
                loss.backward()  # through the gradient too: a double backward
                opt_c.step()
                if step >= 1 and penalty.item() < 0.05:
                    break
            loss = -critic(gen(torch.randn(batch, z_dim))).mean()
            opt_g.zero_grad()
            loss.backward()
            opt_g.step()
    return run


class FeatureTokenizer(nn.Module):
    """FT-Transformer's tokenizer: each numeric feature scales its own
    vector (plus a bias), each categorical column has its own small
    embedding table, and a CLS token goes first."""

    def __init__(self, numeric, cardinalities, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(numeric, d) * 0.1)
        self.bias = nn.Parameter(torch.zeros(numeric, d))
        self.tables = nn.ModuleList(nn.Embedding(n, d) for n in cardinalities)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))

    def forward(self, numbers, categories):
        num = numbers.unsqueeze(-1) * self.weight + self.bias
        cat = torch.stack([table(categories[:, i]) for i, table in enumerate(self.tables)], 1)
        return torch.cat((self.cls.expand(len(numbers), -1, -1), num, cat), 1)


def tabular_ft_transformer():
    torch.manual_seed(181)
    rng = random.Random(181)
    numeric, d = 12, 64
    cardinalities = [int(2 ** rng.uniform(1, 13)) for _ in range(40)]  # 2 to 8,192 values a column
    tok = FeatureTokenizer(numeric, cardinalities, d)
    layers = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 2 * d, 0.1, batch_first=True,
                                                              norm_first=True), 3, enable_nested_tensor=False)
    head = nn.Sequential(nn.LayerNorm(d), nn.ReLU(), nn.Linear(d, 1))
    params = [p for m in (tok, layers, head) for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=1e-5)
    batches = [rng.choice((64, 128, 256, 512)) for _ in range(6)]
    sizes = torch.tensor(cardinalities)

    def run():
        for batch in batches:
            numbers = torch.randn(batch, numeric)
            categories = (torch.rand(batch, len(cardinalities)) * sizes).long()
            logit = head(layers(tok(numbers, categories))[:, 0]).squeeze(1)
            loss = nn.functional.binary_cross_entropy_with_logits(logit, torch.rand(batch).round())
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


class SegmentationUNet(nn.Module):
    """A 3-level U-Net for segmentation (16-64 channels, batch norm, skip
    connections by concatenation), any input whose sides 8 divides."""

    def __init__(self, classes, widths=(16, 32, 64)):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())
        self.down, cin = nn.ModuleList(), 3
        for w in widths:
            self.down.append(block(cin, w))
            cin = w
        self.middle = block(cin, 2 * cin)
        self.ups, self.up_blocks, cin = nn.ModuleList(), nn.ModuleList(), 2 * cin
        for w in reversed(widths):
            self.ups.append(nn.ConvTranspose2d(cin, w, 2, 2))
            self.up_blocks.append(block(2 * w, w))
            cin = w
        self.out = nn.Conv2d(cin, classes, 1)

    def forward(self, x):
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = nn.functional.max_pool2d(x, 2)
        x = self.middle(x)
        for up, block, skip in zip(self.ups, self.up_blocks, reversed(skips)):
            x = block(torch.cat((up(x), skip), 1))
        return self.out(x)


def blob_masks(batch, height, width, classes):
    """Label maps of a few random discs of random classes on background 0,
    so that which classes a crop holds varies from batch to batch."""
    ys, xs = torch.arange(height).view(-1, 1), torch.arange(width).view(1, -1)
    masks = torch.zeros(batch, height, width, dtype=torch.long)
    for b in range(batch):
        for _ in range(int(torch.randint(1, 5, ()))):
            cy, cx = torch.randint(0, height, ()), torch.randint(0, width, ())
            r = torch.randint(8, max(9, min(height, width) // 3), ())
            masks[b][(ys - cy) ** 2 + (xs - cx) ** 2 < r * r] = int(torch.randint(1, classes, ()))
    return masks


def seg_unet_dice():
    torch.manual_seed(191)
    classes = 12
    model = SegmentationUNet(classes)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = random.Random(191)
    shapes = []
    for _ in range(6):  # random rectangular crops, a pixel budget a batch
        height, width = rng.randrange(96, 321, 16), rng.randrange(96, 321, 16)
        shapes.append((max(1, min(8, 131072 // (height * width))), height, width))
    made = [blob_masks(*shape, classes) for shape in shapes]  # made before recording

    def run():
        for masks in made:
            image = torch.randn(len(masks), 3, *masks.shape[1:]) + masks.unsqueeze(1) * 0.1
            logits = model(image)
            present = masks.unique()  # the dice loss counts only the classes the crop holds
            prob = logits.softmax(1)[:, present]
            target = (masks.unsqueeze(1) == present.view(1, -1, 1, 1)).float()
            overlap = (prob * target).sum((0, 2, 3))
            dice = 1 - (2 * overlap + 1) / (prob.sum((0, 2, 3)) + target.sum((0, 2, 3)) + 1)
            loss = nn.functional.cross_entropy(logits, masks) + dice.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


def clip_contrastive():
    torch.manual_seed(193)
    d, vocab, context = 256, 8192, 77

    def stage(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())
    image_tower = nn.Sequential(stage(3, 32), stage(32, 64), stage(64, 128), stage(128, 256),
                                nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, d))
    tok, pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
    layer = nn.TransformerEncoderLayer(d, 4, 4 * d, 0.0, batch_first=True, norm_first=True)
    text_tower = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
    text_norm, text_proj = nn.LayerNorm(d), nn.Linear(d, d, bias=False)
    logit_scale = nn.Parameter(torch.tensor(2.659))  # log(1 / 0.07), learned
    params = [p for m in (image_tower, tok, pos, text_tower, text_norm, text_proj) for p in m.parameters()]
    opt = torch.optim.AdamW(params + [logit_scale], lr=5e-4, weight_decay=0.1)
    rng = random.Random(193)
    steps = []
    for _ in range(6):  # captions of a long-tailed length, cut at the context
        batch = rng.choice((32, 64, 96))
        steps.append([min(context, int(rng.lognormvariate(2.6, 0.5)) + 2) for _ in range(batch)])

    def run():
        for lengths in steps:
            batch, seq = len(lengths), max(lengths)  # text padded to the batch's longest caption
            images = torch.randn(batch, 3, 64, 64)
            tokens = torch.randint(1, vocab, (batch, seq))
            causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
            h = text_tower(tok(tokens) + pos(torch.arange(seq)), mask=causal, is_causal=True)
            last = torch.tensor(lengths) - 1  # each caption read at its end-of-text token
            text = nn.functional.normalize(text_proj(text_norm(h[torch.arange(batch), last])), dim=-1)
            image = nn.functional.normalize(image_tower(images), dim=-1)
            logits = logit_scale.exp() * image @ text.t()  # every image against every caption
            labels = torch.arange(batch)
            loss = (nn.functional.cross_entropy(logits, labels)
                    + nn.functional.cross_entropy(logits.t(), labels)) / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


class Conv2Plus1d(nn.Sequential):
    """A 3-D convolution factored as R(2+1)D does: a spatial (1, 3, 3)
    convolution to mid channels, batch norm, ReLU, a temporal (3, 1, 1) one."""

    def __init__(self, cin, cout, mid, stride):
        super().__init__(nn.Conv3d(cin, mid, (1, 3, 3), (1, stride, stride), (0, 1, 1), bias=False),
                         nn.BatchNorm3d(mid), nn.ReLU(),
                         nn.Conv3d(mid, cout, (3, 1, 1), (stride, 1, 1), (1, 0, 0), bias=False))


class VideoBlock(nn.Module):
    """A residual block of two (2+1)D convolutions; the first strides time
    and space when stride is 2, a 1x1x1 convolution matching the skip."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(Conv2Plus1d(cin, cout, cout, stride), nn.BatchNorm3d(cout), nn.ReLU(),
                                  Conv2Plus1d(cout, cout, cout, 1), nn.BatchNorm3d(cout))
        self.skip = (nn.Sequential(nn.Conv3d(cin, cout, 1, stride, bias=False), nn.BatchNorm3d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def video_r2plus1d():
    torch.manual_seed(197)
    model = nn.Sequential(
        nn.Conv3d(3, 32, (1, 7, 7), (1, 2, 2), (0, 3, 3), bias=False), nn.BatchNorm3d(32), nn.ReLU(),
        nn.Conv3d(32, 32, (3, 1, 1), 1, (1, 0, 0), bias=False), nn.BatchNorm3d(32), nn.ReLU(),
        VideoBlock(32, 32, 1), VideoBlock(32, 64, 2), VideoBlock(64, 128, 2), VideoBlock(128, 192, 2),
        nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(192, 101))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    rng = random.Random(197)
    clips = []
    for _ in range(6):  # clips of a varying length and crop, as many as a budget of pixels allows
        frames, side = rng.choice((8, 12, 16, 24, 32)), rng.choice((80, 96, 112))
        clips.append((max(1, min(4, 2 * 16 * 96 * 96 // (frames * side * side))), frames, side))

    def run():
        for batch, frames, side in clips:
            logits = model(torch.randn(batch, 3, frames, side, side))
            loss = nn.functional.cross_entropy(logits, torch.randint(0, 101, (batch,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


def box_corners(box):
    """(cx, cy, w, h) to (x0, y0, x1, y1)."""
    centre, size = box[..., :2], box[..., 2:]
    return torch.cat((centre - size / 2, centre + size / 2), -1)


def generalized_iou(a, b):
    """Pairwise generalized IoU of corner boxes a (n, 4) and b (m, 4): the
    IoU less the share of the smallest enclosing box neither covers."""
    area_a, area_b = (a[:, 2:] - a[:, :2]).prod(1), (b[:, 2:] - b[:, :2]).prod(1)
    lo, hi = torch.maximum(a[:, None, :2], b[:, :2]), torch.minimum(a[:, None, 2:], b[:, 2:])
    inter = (hi - lo).clamp(min=0).prod(2)
    union = area_a[:, None] + area_b - inter
    hull = (torch.maximum(a[:, None, 2:], b[:, 2:]) - torch.minimum(a[:, None, :2], b[:, :2])).prod(2)
    return inter / union - (hull - union) / hull


class SetDetector(nn.Module):
    """DETR: a stride-16 convolutional backbone, a transformer encoder over
    its grid (learned row and column positions, padding masked), a decoder
    of object queries whose every layer's output is read by the class and
    box heads (the auxiliary losses)."""

    def __init__(self, classes, d=128, queries=50, layers=3):
        super().__init__()

        def stage(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())
        self.backbone = nn.Sequential(stage(3, 32), stage(32, 64), stage(64, 128), stage(128, d))
        self.rows, self.cols = nn.Embedding(64, d // 2), nn.Embedding(64, d // 2)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 8, 4 * d, 0.0, batch_first=True),
                                             layers, enable_nested_tensor=False)
        self.decoder = nn.ModuleList(nn.TransformerDecoderLayer(d, 8, 4 * d, 0.0, batch_first=True)
                                     for _ in range(layers))
        self.queries = nn.Embedding(queries, d)
        self.norm, self.classify = nn.LayerNorm(d), nn.Linear(d, classes + 1)  # the last class: no object
        self.box = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 4))

    def forward(self, images, pad):
        f = self.backbone(images)
        b, d, h, w = f.shape
        pos = torch.cat((self.rows.weight[:h, None].expand(h, w, -1),
                         self.cols.weight[None, :w].expand(h, w, -1)), -1).view(1, h * w, d)
        pad = pad[:, ::16, ::16].reshape(b, h * w)
        memory = self.encoder(f.flatten(2).transpose(1, 2) + pos, src_key_padding_mask=pad)
        q, outs = self.queries.weight.expand(b, -1, -1), []
        x = torch.zeros_like(q)
        for layer in self.decoder:
            x = layer(x + q, memory, memory_key_padding_mask=pad)
            y = self.norm(x)
            outs.append((self.classify(y), self.box(y).sigmoid()))
        return outs


def set_loss(logits, boxes, labels, targets, classes):
    """DETR's loss for one image and one decoder layer: the queries matched
    one to one with the targets by the Hungarian algorithm on a class, L1 and
    GIoU cost; cross entropy over all queries (unmatched ones as no object,
    weighted 0.1), L1 and GIoU over the matched."""
    from scipy.optimize import linear_sum_assignment
    prob = logits.softmax(-1)
    cost = (-prob[:, labels] + 5 * torch.cdist(boxes, targets, p=1)
            - 2 * generalized_iou(box_corners(boxes), box_corners(targets)))
    rows, cols = linear_sum_assignment(cost.detach().numpy())
    rows, cols = torch.as_tensor(rows), torch.as_tensor(cols)
    wanted = torch.full((len(logits),), classes)
    wanted[rows] = labels[cols]
    weight = torch.ones(classes + 1)
    weight[classes] = 0.1
    matched, target = boxes[rows], targets[cols]
    return (nn.functional.cross_entropy(logits, wanted, weight) + 5 * (matched - target).abs().sum(1).mean()
            + 2 * (1 - generalized_iou(box_corners(matched), box_corners(target)).diagonal()).mean())


def detr_set_matching():
    torch.manual_seed(199)
    classes = 20
    model = SetDetector(classes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    rng = random.Random(199)
    steps = []
    for _ in range(6):  # images of their own sizes, padded to the batch's largest; 1-30 objects each
        count = rng.choice((2, 4))
        sizes = [(rng.randrange(160, 385, 16), rng.randrange(160, 385, 16)) for _ in range(count)]
        steps.append([(h, w, rng.randint(1, 30)) for h, w in sizes])

    def run():
        for images in steps:
            height, width = max(h for h, _, _ in images), max(w for _, w, _ in images)
            batch = torch.zeros(len(images), 3, height, width)
            pad = torch.ones(len(images), height, width, dtype=torch.bool)
            for i, (h, w, _) in enumerate(images):
                batch[i, :, :h, :w] = torch.randn(3, h, w)
                pad[i, :h, :w] = False
            targets = []
            for _, _, n in images:  # boxes as (cx, cy, w, h), a share of the image
                centre, size = torch.rand(n, 2) * 0.6 + 0.2, torch.rand(n, 2) * 0.3 + 0.05
                targets.append((torch.randint(0, classes, (n,)), torch.cat((centre, size), 1)))
            loss = sum(set_loss(logits[i], boxes[i], *targets[i], classes)
                       for logits, boxes in model(batch, pad) for i in range(len(images)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


class FastWaveNet(nn.Module):
    """A WaveNet vocoder run one sample at a time as fast WaveNet does: each
    layer keeps a queue of its last dilation inputs, so a step costs one
    gated unit a layer; the mel conditioning of every layer is computed for
    the whole utterance first."""

    def __init__(self, mels=80, channels=128, skip=256, layers=10, levels=256, hop=32):
        super().__init__()
        self.dilations = [2 ** i for i in range(layers)]
        self.channels, self.skip_channels = channels, skip
        self.upsample = nn.ConvTranspose1d(mels, mels, 2 * hop, hop, hop // 2)
        self.cond = nn.Conv1d(mels, layers * 2 * channels, 1)
        self.embed = nn.Embedding(levels, channels)
        self.gate = nn.ModuleList(nn.Linear(2 * channels, 2 * channels) for _ in range(layers))
        self.res = nn.ModuleList(nn.Linear(channels, channels) for _ in range(layers))
        self.skip = nn.ModuleList(nn.Linear(channels, skip) for _ in range(layers))
        self.out = nn.Sequential(nn.ReLU(), nn.Linear(skip, skip), nn.ReLU(), nn.Linear(skip, levels))

    def conditioning(self, mel):
        """(samples, batch, layers, 2 x channels) from a (batch, mels, frames) spectrogram."""
        c = self.cond(self.upsample(mel))
        return c.view(len(mel), len(self.gate), -1, c.shape[-1]).permute(3, 0, 1, 2).contiguous()

    def step(self, sample, cond, queues, t):
        x, skip = self.embed(sample), 0
        for i, (d, queue) in enumerate(zip(self.dilations, queues)):
            past = queue[:, :, t % d]  # this layer's input d samples ago
            z = self.gate[i](torch.cat((past, x), 1)) + cond[:, i]
            g = torch.tanh(z[:, :self.channels]) * torch.sigmoid(z[:, self.channels:])
            queue[:, :, t % d] = x
            skip = skip + self.skip[i](g)
            x = x + self.res[i](g)
        return self.out(skip)


def wavenet_vocoder():
    torch.manual_seed(211)
    model = FastWaveNet().eval()
    rng = random.Random(211)
    requests = [[rng.randint(2, 6) for _ in range(rng.choice((1, 2, 4)))] for _ in range(3)]

    def run():
        with torch.no_grad():
            for frames in requests:  # each utterance leaves the batch when its samples are made
                mel = torch.randn(len(frames), 80, max(frames))
                cond = model.conditioning(mel)
                ends = torch.tensor(frames) * (cond.shape[0] // max(frames))
                queues = [torch.zeros(len(frames), model.channels, d) for d in model.dilations]
                alive, sample = torch.arange(len(frames)), torch.full((len(frames),), 128)
                for t in range(int(ends.max())):
                    logits = model.step(sample, cond[t], queues, t)
                    sample = torch.multinomial(logits.softmax(-1), 1).squeeze(1)
                    keep = (ends[alive] > t + 1).nonzero().squeeze(1)
                    if len(keep) < len(alive):  # the batch shrinks: queues and conditioning follow
                        alive, sample = alive[keep], sample[keep]
                        queues = [q[keep] for q in queues]
                        cond = cond[:, keep]
    return run


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update B A, scaled by
    alpha / rank (B starts at zero, so training starts from the base model)."""

    def __init__(self, cin, cout, rank=8, alpha=16):
        super().__init__()
        self.base = nn.Linear(cin, cout).requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, cin) / cin ** 0.5)
        self.b = nn.Parameter(torch.zeros(cout, rank))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.a.t() @ self.b.t()) * self.scale


class LoRADecoderBlock(nn.Module):
    """A pre-norm causal decoder block whose attention projections and MLP
    carry LoRA adapters; norms frozen with the rest of the base."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.LayerNorm(d).requires_grad_(False), nn.LayerNorm(d).requires_grad_(False)
        self.q, self.k, self.v, self.o = (LoRALinear(d, d) for _ in range(4))
        self.up, self.down = LoRALinear(d, 4 * d), LoRALinear(4 * d, d)

    def forward(self, x):
        b, n, d = x.shape
        h = self.n1(x)
        q, k, v = (p(h).view(b, n, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, n, d))
        return x + self.down(nn.functional.gelu(self.up(self.n2(x))))


def lora_grad_accum():
    torch.manual_seed(223)
    vocab, d = 8192, 384
    emb, pos = nn.Embedding(vocab, d).requires_grad_(False), nn.Embedding(1024, d).requires_grad_(False)
    blocks = nn.ModuleList(LoRADecoderBlock(d, 6) for _ in range(6))
    norm = nn.LayerNorm(d).requires_grad_(False)
    adapters = [p for p in blocks.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(adapters, lr=2e-4)
    rng = random.Random(223)
    steps = []
    for _ in range(4):  # an optimizer step accumulates 2-4 micro-batches of long-tailed lengths
        micro = []
        for _ in range(rng.randint(2, 4)):
            lengths = [min(1024, int(rng.lognormvariate(5.3, 0.7)) + 16) for _ in range(rng.choice((1, 2, 4)))]
            while len(lengths) * max(lengths) > 2048:  # a token budget a micro-batch
                lengths.pop()
            micro.append(lengths)
        steps.append(micro)

    def run():
        for micro in steps:
            opt.zero_grad()
            for lengths in micro:  # padded to the micro-batch's longest; padding left out of the loss
                length = max(lengths)
                tokens = torch.randint(0, vocab, (len(lengths), length + 1))
                pad = torch.arange(length).unsqueeze(0) >= torch.tensor(lengths).unsqueeze(1)
                x = emb(tokens[:, :-1]) + pos.weight[:length]
                for block in blocks:
                    x = block(x)
                logits = norm(x) @ emb.weight.t()  # tied, frozen
                target = tokens[:, 1:].masked_fill(pad, -100)
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten()) / len(micro)
                loss.backward()
            opt.step()
    return run


def mlp(cin, hidden, cout, norm=True):
    """The simulator's two-hidden-layer MLP, layer-normed but for the decoder's."""
    layers = [nn.Linear(cin, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, cout)]
    return nn.Sequential(*layers, nn.LayerNorm(cout)) if norm else nn.Sequential(*layers)


class ParticleSimulator(nn.Module):
    """A learned particle simulator in the encode-process-decode form: nodes
    encode their recent velocities and distances to the walls, edges of the
    radius graph their displacement and length; message-passing steps update
    edges from their ends and nodes from the sum of their incoming edges
    (index_add); nodes decode to an acceleration."""

    def __init__(self, history=5, latent=64, passes=5):
        super().__init__()
        self.node_in, self.edge_in = mlp(2 * history + 4, latent, latent), mlp(3, latent, latent)
        self.edge_fn = nn.ModuleList(mlp(3 * latent, latent, latent) for _ in range(passes))
        self.node_fn = nn.ModuleList(mlp(2 * latent, latent, latent) for _ in range(passes))
        self.out = mlp(latent, latent, 2, norm=False)

    def forward(self, positions, radius):
        """positions: (history + 1, particles, 2) in double precision,
        oldest first; the features made of them are single."""
        now = positions[-1]
        velocities = (positions[1:] - positions[:-1]).transpose(0, 1).flatten(1).float()
        walls = (torch.cat((now, 1 - now), 1).clamp(max=radius) / radius).float()
        src, dst = radius_graph(now, radius)
        rel = ((now[src] - now[dst]) / radius).float()
        h = self.node_in(torch.cat((velocities, walls), 1))
        e = self.edge_in(torch.cat((rel, rel.norm(dim=1, keepdim=True)), 1))
        for edge_fn, node_fn in zip(self.edge_fn, self.node_fn):
            e = e + edge_fn(torch.cat((e, h[src], h[dst]), 1))
            h = h + node_fn(torch.cat((h, torch.zeros_like(h).index_add_(0, dst, e)), 1))
        return self.out(h)


def radius_graph(pos, radius):
    """Every ordered pair of distinct particles closer than radius, found a
    row block at a time so the distance matrix is never whole.  The
    distances are taken as differences (of double positions): the
    matrix-product form's rounding depends on the buffers' alignment, so
    pairs near the radius came and went from one run to the next."""
    src, dst = [], []
    for start in range(0, len(pos), 1024):
        near = (torch.cdist(pos[start:start + 1024], pos, compute_mode="donot_use_mm_for_euclid_dist")
                < radius).nonzero()
        near = near[near[:, 0] + start != near[:, 1]]
        src.append(near[:, 1])
        dst.append(near[:, 0] + start)
    return torch.cat(src), torch.cat(dst)


def particle_gns_rollout():
    torch.manual_seed(227)
    # positions kept in double: in single, a last-place rounding the model's
    # output tipped one way or the other grew step by step and moved edges
    history, radius, gravity = 5, 0.025, torch.tensor([0.0, -2e-4], dtype=torch.float64)
    model = ParticleSimulator(history)
    # SGD, not Adam: Adam's normalised step turned the rounding noise of
    # gradients that are zero in exact arithmetic (biases ahead of a
    # LayerNorm) into steps of full size, so runs drifted apart
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    rng = random.Random(227)
    scenes = []
    for _ in range(3):  # blocks of fluid of random sizes dropped into a unit box
        blocks = []
        for _ in range(rng.randint(1, 3)):
            w, h = rng.uniform(0.12, 0.35), rng.uniform(0.12, 0.35)
            blocks.append((rng.uniform(0.05, 0.95 - w), rng.uniform(0.05, 0.95 - h), w, h))
        scenes.append((blocks, rng.randint(10, 20)))

    def trajectory(blocks):
        """history + 1 positions of particles thrown from a jittered lattice,
        0.012 apart, each at its own speed, falling (gravity 2e-4 a step
        squared), kept in the box."""
        points = []
        for x0, y0, w, h in blocks:
            xs, ys = torch.arange(x0, x0 + w, 0.012), torch.arange(y0, y0 + h, 0.012)
            points.append(torch.stack(torch.meshgrid(xs, ys, indexing="ij"), -1).view(-1, 2))
        start = torch.cat(points).double() + torch.randn(sum(len(p) for p in points), 2) * 0.001
        speed = torch.randn(len(start), 2) * 1e-3 + torch.tensor([0.0, -2e-3])
        k = torch.arange(history + 1.0, dtype=torch.float64).view(-1, 1, 1)
        return (start + speed * k + gravity * k ** 2 / 2).clamp(0, 1)

    def run():
        for blocks, rollout in scenes:
            positions = trajectory(blocks)
            for _ in range(2):  # training on one-step accelerations, positions noised as in training a GNS
                noisy = positions + torch.randn_like(positions) * 3e-4
                target = torch.randn(positions.shape[1], 2)  # a stand-in for the next step's acceleration
                loss = (model(noisy, radius) - target).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            with torch.no_grad():  # the rollout: each step's positions make the next step's radius graph
                for _ in range(rollout):
                    velocity = positions[-1] - positions[-2] + gravity + model(positions, radius) * 1e-6
                    nxt = (positions[-1] + velocity).clamp(0, 1)
                    positions = torch.cat((positions[1:], nxt.unsqueeze(0)))
    return run


class LocationAttention(nn.Module):
    """Tacotron 2's location-sensitive attention: the energy reads the
    query, the encoder outputs (projected once an utterance) and a
    convolution over the previous and cumulative alignments."""

    def __init__(self, query, memory, dim=128, filters=32, kernel=31):
        super().__init__()
        self.q, self.m = nn.Linear(query, dim, bias=False), nn.Linear(memory, dim, bias=False)
        self.location = nn.Sequential(nn.Conv1d(2, filters, kernel, padding=kernel // 2, bias=False),
                                      nn.Conv1d(filters, dim, 1, bias=False))
        self.v = nn.Linear(dim, 1, bias=False)

    def forward(self, query, keys, memory, alignments, pad):
        loc = self.location(alignments).transpose(1, 2)
        energy = self.v(torch.tanh(self.q(query).unsqueeze(1) + keys + loc)).squeeze(2)
        weights = energy.masked_fill(pad, float("-inf")).softmax(1)
        return torch.bmm(weights.unsqueeze(1), memory).squeeze(1), weights


class Tacotron(nn.Module):
    """Tacotron 2 at a reduced width: a convolutional and bidirectional LSTM
    text encoder; an autoregressive decoder (prenet, attention LSTM,
    location-sensitive attention, decoder LSTM) emitting r mel frames and a
    stop logit a step; a convolutional postnet."""

    def __init__(self, symbols=80, mels=80, enc=256, rnn=512, r=2):
        super().__init__()
        self.mels, self.r, self.rnn = mels, r, rnn
        self.embed = nn.Embedding(symbols, enc)
        self.convs = nn.Sequential(*(m for _ in range(3) for m in (nn.Conv1d(enc, enc, 5, padding=2),
                                                                    nn.BatchNorm1d(enc), nn.ReLU())))
        self.lstm = nn.LSTM(enc, enc // 2, batch_first=True, bidirectional=True)
        self.prenet = nn.Sequential(nn.Linear(mels, 128), nn.ReLU(), nn.Dropout(0.5),
                                    nn.Linear(128, 128), nn.ReLU(), nn.Dropout(0.5))
        self.attention_rnn = nn.LSTMCell(128 + enc, rnn)
        self.attention = LocationAttention(rnn, enc)
        self.decoder_rnn = nn.LSTMCell(rnn + enc, rnn)
        self.frames = nn.Linear(rnn + enc, mels * r)
        self.stop = nn.Linear(rnn + enc, 1)
        self.postnet = nn.Sequential(*(m for cin, cout in ((mels, 256), (256, 256), (256, 256), (256, 256))
                                       for m in (nn.Conv1d(cin, cout, 5, padding=2), nn.BatchNorm1d(cout),
                                                 nn.Tanh())), nn.Conv1d(256, mels, 5, padding=2))

    def forward(self, text, text_lengths, mel):
        """Teacher forcing: step t reads the last of the true frames of step t - 1."""
        b, steps = len(text), mel.shape[1] // self.r
        x = self.convs(self.embed(text).transpose(1, 2)).transpose(1, 2)
        memory, _ = self.lstm(nn.utils.rnn.pack_padded_sequence(x, text_lengths, batch_first=True,
                                                                 enforce_sorted=False))
        memory, _ = nn.utils.rnn.pad_packed_sequence(memory, batch_first=True)
        keys = self.attention.m(memory)
        pad = torch.arange(memory.shape[1]).unsqueeze(0) >= text_lengths.unsqueeze(1)
        previous = torch.cat((mel.new_zeros(b, 1, self.mels), mel[:, self.r - 1:-1:self.r]), 1)
        inputs = self.prenet(previous)
        h1, c1, h2, c2 = (mel.new_zeros(b, self.rnn) for _ in range(4))
        context, weights = mel.new_zeros(b, memory.shape[2]), mel.new_zeros(b, memory.shape[1])
        cumulative, frames, stops = torch.zeros_like(weights), [], []
        for t in range(steps):
            h1, c1 = self.attention_rnn(torch.cat((inputs[:, t], context), 1), (h1, c1))
            context, weights = self.attention(h1, keys, memory, torch.stack((weights, cumulative), 1), pad)
            cumulative = cumulative + weights
            h2, c2 = self.decoder_rnn(torch.cat((h1, context), 1), (h2, c2))
            out = torch.cat((h2, context), 1)
            frames.append(self.frames(out).view(b, self.r, self.mels))
            stops.append(self.stop(out))
        before = torch.cat(frames, 1)
        after = before + self.postnet(before.transpose(1, 2)).transpose(1, 2)
        return before, after, torch.cat(stops, 1)


def tacotron_tts():
    torch.manual_seed(229)
    model = Tacotron()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-6)
    rng = random.Random(229)
    batches = []
    for _ in range(3):  # utterances of 16-120 symbols, about 4 frames a symbol, varying with the speaker
        texts = [rng.randint(16, 120) for _ in range(rng.choice((2, 4, 8)))]
        batches.append([(n, int(n * rng.uniform(3.0, 5.0)) // 2 * 2) for n in texts])

    def run():
        for utterances in batches:
            text_lengths = torch.tensor([n for n, _ in utterances])
            mel_lengths = torch.tensor([m for _, m in utterances])
            text = torch.randint(1, 80, (len(utterances), int(text_lengths.max())))
            text.masked_fill_(torch.arange(text.shape[1]) >= text_lengths.unsqueeze(1), 0)
            frames = int(mel_lengths.max())
            mel = torch.randn(len(utterances), frames, 80)
            valid = torch.arange(frames) < mel_lengths.unsqueeze(1)
            mel = mel * valid.unsqueeze(2)
            before, after, stops = model(text, text_lengths, mel)
            step_valid = valid[:, ::model.r]
            stop_target = (torch.arange(0, frames, model.r) >= mel_lengths.unsqueeze(1) - model.r).float()
            mask = valid.unsqueeze(2).float()
            loss = (((before - mel) ** 2 + (after - mel) ** 2) * mask).sum() / (mask.sum() * 80)
            loss = loss + nn.functional.binary_cross_entropy_with_logits(stops[step_valid],
                                                                         stop_target[step_valid])
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    return run


class MaskedAutoencoder(nn.Module):
    """MAE: the encoder sees only the patches a random mask leaves visible
    (chosen per image by sorting noise); the decoder sees every position,
    mask tokens put back where the hidden patches were."""

    def __init__(self, patch=16, d=256, depth=6, dd=128, decoder_depth=2, positions=196):
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(3 * patch * patch, d)
        self.pos = nn.Parameter(torch.zeros(positions, d))
        self.decoder_pos = nn.Parameter(torch.zeros(positions, dd))
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 8, 4 * d, 0.0, batch_first=True,
                                                                        norm_first=True), depth,
                                             enable_nested_tensor=False)
        self.to_decoder, self.mask_token = nn.Linear(d, dd), nn.Parameter(torch.zeros(dd))
        self.decoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(dd, 4, 4 * dd, 0.0, batch_first=True,
                                                                        norm_first=True), decoder_depth,
                                             enable_nested_tensor=False)
        self.pixels = nn.Linear(dd, 3 * patch * patch)

    def forward(self, images, ratio):
        p = self.patch
        patches = images.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).flatten(1, 2).flatten(2)
        b, n, _ = patches.shape
        keep = int(n * (1 - ratio))
        order = torch.rand(b, n).argsort(1)
        restore = order.argsort(1)
        visible = order[:, :keep]
        x = (self.embed(patches) + self.pos[:n]).gather(1, visible.unsqueeze(2).expand(-1, -1, self.pos.shape[1]))
        x = self.to_decoder(self.encoder(x))
        x = torch.cat((x, self.mask_token.expand(b, n - keep, -1)), 1)
        x = x.gather(1, restore.unsqueeze(2).expand(-1, -1, x.shape[2])) + self.decoder_pos[:n]
        predicted = self.pixels(self.decoder(x))
        target = (patches - patches.mean(-1, keepdim=True)) / (patches.var(-1, keepdim=True) + 1e-6).sqrt()
        hidden = torch.ones(b, n).scatter_(1, visible, 0.0)
        return (((predicted - target) ** 2).mean(-1) * hidden).sum() / hidden.sum()


def mae_random_masking():
    torch.manual_seed(233)
    model = MaskedAutoencoder()
    opt = torch.optim.AdamW(model.parameters(), lr=1.5e-4, betas=(0.9, 0.95), weight_decay=0.05)
    rng = random.Random(233)
    steps = []
    for _ in range(6):  # a mask ratio a step, images of 96-224 pixels, a batch under a budget of patches
        side = rng.choice((96, 128, 160, 192, 224))
        steps.append((max(4, min(64, 6272 // (side // 16) ** 2)), side, rng.uniform(0.4, 0.9)))

    def run():
        for batch, side, ratio in steps:
            loss = model(torch.randn(batch, 3, side, side), ratio)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run


RECORDERS = (("gnn_message_passing", gnn_message_passing), ("detector_boxes", detector_boxes),
             ("dlrm_recsys", dlrm_recsys), ("conformer_ctc", conformer_ctc),
             ("swin_windows", swin_windows), ("vae_train", vae_train),
             ("ssm_chunked_scan", ssm_chunked_scan), ("pointnet_grouping", pointnet_grouping),
             ("early_exit_depths", early_exit_depths),
             ("speculative_decoding", speculative_decoding),
             ("neural_ode_adaptive", neural_ode_adaptive),
             ("two_tower_retrieval", two_tower_retrieval),
             ("rnnt_transducer", rnnt_transducer),
             ("beam_search_shrinking", beam_search_shrinking),
             ("perceiver_bytes", perceiver_bytes), ("packed_lm_varlen", packed_lm_varlen),
             ("gan_gradient_penalty", gan_gradient_penalty),
             ("tabular_ft_transformer", tabular_ft_transformer),
             ("seg_unet_dice", seg_unet_dice), ("clip_contrastive", clip_contrastive),
             ("video_r2plus1d", video_r2plus1d), ("detr_set_matching", detr_set_matching),
             ("wavenet_vocoder", wavenet_vocoder), ("lora_grad_accum", lora_grad_accum),
             ("particle_gns_rollout", particle_gns_rollout), ("tacotron_tts", tacotron_tts),
             ("mae_random_masking", mae_random_masking))


def main():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    unknown = set(sys.argv[1:]) - {name for name, _ in RECORDERS}
    if unknown:  # a misspelt name would otherwise record nothing, silently
        sys.exit(f"no such family: {', '.join(sorted(unknown))}")
    os.makedirs(OUT, exist_ok=True)
    for name, make in RECORDERS:
        if len(sys.argv) > 1 and name not in sys.argv[1:]:
            continue
        csv = to_csv(memory_events(make()))
        path = os.path.join(OUT, name + ".csv.gz")
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(csv.encode())
        print(f"{name}: {csv.count(chr(10)) - 1} events, {os.path.getsize(path)} bytes gzip")


if __name__ == "__main__":
    main()
