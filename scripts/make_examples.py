"""Generates the example workloads shipped in src/ascmem/examples/.

Each workload is built from documented real sizes (cited beside each number)
and a fixed seed, so the files are reproducible:  python scripts/make_examples.py
"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from ascmem.trace import Event, Trace, save  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "src", "ascmem", "examples")
HUGE_FIRST, HUGE_ONLY, NORMAL_ONLY = 0, 1, 2


class Builder:
    def __init__(self):
        self.events, self.next_id = [], 0

    def alloc(self, size, kind, policy=HUGE_FIRST):
        i = self.next_id
        self.next_id += 1
        self.events.append(Event("a", i, size, kind, policy))
        return i

    def free(self, i):
        first = next(e for e in reversed(self.events) if e.id == i and e.op == "a")
        self.events.append(Event("f", i, first.size, first.kind, first.policy))


def video_pipeline():
    """Video analytics on atlas-inference: 3 streams of 1080p H.264 decoded by
    VDEC into media memory, resized by VPC into the detector's input, YOLOv3."""
    b = Builder()
    # YOLOv3-416: 61,949,149 parameters (darknet yolov3.cfg), stored as fp16 in
    # the offline model: 123,898,298 bytes, loaded once into huge pages.
    b.alloc(61_949_149 * 2, "huge", HUGE_ONLY)
    # Model workspace reported by the ATC-converted model (assumed 32 MiB).
    b.alloc(32 << 20, "huge", HUGE_ONLY)
    decoded = {s: [] for s in range(3)}
    for frame in range(120):
        for s in range(3):
            # 1920x1080 YUV420SP: 1920 * 1080 * 3 / 2 = 3,110,400 bytes (VDEC output)
            decoded[s].append(b.alloc(3_110_400, "dvpp"))
            if len(decoded[s]) > 3:  # each decoder keeps its last 3 frames
                b.free(decoded[s].pop(0))
            # VPC resize to 416x416 YUV420SP (width 16-aligned, height 2-aligned):
            # 416 * 416 * 3 / 2 = 259,584 bytes, fed to the model as input (reuse)
            resized = b.alloc(259_584, "dvpp")
            # YOLOv3 heads, fp32: 13*13*255*4, 26*26*255*4, 52*52*255*4 bytes
            heads = [b.alloc(n, "normal" if n <= 1 << 20 else "huge")
                     for n in (172_380, 689_520, 2_758_080)]
            b.free(resized)
            # post-processing copies the boxes to the host: 100 boxes * 6 floats
            box = b.alloc(100 * 6 * 4, "host")
            for h in heads:
                b.free(h)
            b.free(box)
    return Trace(b.events, "video_pipeline")


def batch_inference():
    """A batch-inference service on atlas-training: ResNet-50, batch 32, fp32."""
    b = Builder()
    # ResNet-50: 25,557,032 parameters (torchvision), fp32: 102,228,128 bytes
    b.alloc(25_557_032 * 4, "huge", HUGE_ONLY)
    stages = [
        32 * 64 * 112 * 112 * 4,   # conv1 output
        32 * 256 * 56 * 56 * 4,    # layer1
        32 * 512 * 28 * 28 * 4,    # layer2
        32 * 1024 * 14 * 14 * 4,   # layer3
        32 * 2048 * 7 * 7 * 4,     # layer4
        32 * 2048 * 4,             # pooled features
    ]
    for _ in range(40):
        staged = b.alloc(32 * 3 * 224 * 224 * 4, "host")   # 19,267,584-byte input batch
        inp = b.alloc(32 * 3 * 224 * 224 * 4, "huge")
        b.free(staged)
        prev = inp
        for n in stages:
            cur = b.alloc(n, "huge" if n > 1 << 20 else "normal")
            b.free(prev)
            prev = cur
        logits = b.alloc(32 * 1000 * 4, "normal")          # 128,000-byte output
        b.free(prev)
        result = b.alloc(32 * 1000 * 4, "host")
        b.free(logits)
        b.free(result)
    return Trace(b.events, "batch_inference")


def many_small():
    """Many small tensors: a BERT-base encoder step, batch 8, sequence 128, fp16,
    with the bookkeeping tensors frameworks create around every op."""
    rng = random.Random(7)
    b = Builder()
    b.alloc(110_000_000 * 2, "huge", HUGE_ONLY)  # BERT-base: ~110 M parameters, fp16
    hidden = 8 * 128 * 768 * 2          # 1,572,864: activations [8, 128, 768]
    scores = 8 * 12 * 128 * 128 * 2     # 3,145,728: attention scores [8, 12, 128, 128]
    ffn = 8 * 128 * 3072 * 2            # 6,291,456: feed-forward [8, 128, 3072]
    small = [4, 8, 32, 64, 768 * 2, 768 * 4, 3072 * 2, 128 * 8, 8 * 128 * 4]  # scalars,
    # shapes, biases, LayerNorm statistics, masks and position ids
    live_small = []
    for _layer in range(12 * 6):
        x = b.alloc(hidden, "normal")
        for n in (scores, scores, ffn):
            t = b.alloc(n, "huge")
            for _ in range(rng.randint(8, 24)):
                live_small.append(b.alloc(rng.choice(small), "normal"))
                if len(live_small) > 300 or rng.random() < 0.4:
                    b.free(live_small.pop(rng.randrange(len(live_small))))
            b.free(t)
        b.free(x)
    for i in live_small:
        b.free(i)
    return Trace(b.events, "many_small")


EXAMPLES = {"video_pipeline": video_pipeline, "batch_inference": batch_inference,
            "many_small": many_small}


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for name, make in EXAMPLES.items():
        t = make()
        path = os.path.join(OUT, f"{name}.csv.gz")
        save(t, path)
        print(f"{path}: {len(t)} events, peak live {t.peak_live() / 2**20:.1f} MiB")
