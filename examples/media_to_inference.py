"""Media -> inference on real host memory, with no copy between them.

Frames of 1920x1080 YUV420SP (3,110,400 bytes) are written into media (DVPP)
buffers, resized with numpy into the model-input layout (224x224x3, uint8)
inside a second media buffer, and handed to a small numpy "model" through
Device.as_model_input: same address, same bytes.

    python examples/media_to_inference.py [FRAMES]
"""
import sys
import time
from typing import Any

import numpy as np
import numpy.typing as npt

import ascmem

W, H = 1920, 1080
FRAME = W * H * 3 // 2           # YUV420SP: a full-size Y plane, then interleaved UV at half size
IN_H = IN_W = 224
rows = (np.arange(IN_H) * H // IN_H)
cols = (np.arange(IN_W) * W // IN_W)


def decode_into(view: npt.NDArray[Any], n: int) -> None:
    """Stands in for the video decoder: writes frame n into a media buffer."""
    y = view[: W * H].reshape(H, W)
    y[:] = (np.arange(W, dtype=np.uint16)[None, :] + n) % 251
    view[W * H:] = 128


def resize_into(src: npt.NDArray[Any], dst: npt.NDArray[Any]) -> None:
    """Nearest-neighbour resize of the Y plane into a 224x224x3 model input."""
    y = src[: W * H].reshape(H, W)
    small = y[rows[:, None], cols[None, :]]
    dst.reshape(IN_H, IN_W, 3)[:] = small[:, :, None]


def main(frames: int = 300) -> int:
    dev = ascmem.Device("atlas-inference", backend="host")
    weights = dev.malloc(3 * 16 * 4, ascmem.Policy.HUGE_ONLY)           # a 3->16 linear layer
    w = dev.as_array(weights, (3, 16), np.float32)
    w[:] = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    frame = dev.dvpp_malloc(FRAME)
    model_in = dev.dvpp_malloc(IN_H * IN_W * 3)
    checksum = 0.0
    t0 = time.perf_counter()
    for n in range(frames):
        decode_into(dev.as_array(frame, FRAME), n)
        resize_into(dev.as_array(frame, FRAME), dev.as_array(model_in, IN_H * IN_W * 3))
        ptr = dev.as_model_input(model_in, IN_H * IN_W * 3)             # no copy
        assert ptr == model_in
        x = dev.as_array(ptr, (IN_H * IN_W, 3))
        assert x.ctypes.data == model_in                                # the same bytes
        logits = (x.astype(np.float32) / 255.0) @ w
        checksum += float(logits.mean())
    dt = time.perf_counter() - t0
    del w, x
    s = dev.stats()
    print(f"{frames} frames in {dt:.2f} s: {frames / dt:.1f} frames/s "
          f"({frames * FRAME / dt / 2**20:.0f} MiB/s of decoded video); checksum {checksum:.4f}")
    print(f"pages: {dev.pages()}")
    print(f"media memory in use: {s['dvpp']['used']:,} bytes in {s['dvpp']['live_count']} buffers; "
          f"reused as model input: {s['device']['reused_bytes']:,} bytes in "
          f"{s['device']['reuse_count']} hand-overs (no copies)")
    print(f"device budget: huge {s['device']['huge_used']:,} B, normal "
          f"{s['device']['normal_used']:,} B of {s['device']['total']:,} B")
    dev.dvpp_free(frame)
    dev.dvpp_free(model_in)
    dev.free(weights)
    dev.check()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))
