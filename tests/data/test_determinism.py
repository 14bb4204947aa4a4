"""Toy-world bytes do not depend on what ran before in the process or on what runs beside it.

Each generation runs in a fresh subprocess after a different prelude and the file hashes
are compared with a clean run. The preludes are the states that reached the generator in
a full ``make test`` process: the heavy ML stack (torch, transformers, DeepSpeed, the
MiniLM sentence embedder) and FTZ/DAZ float modes; other threads decoding and encoding
video and multiplying matrices while it runs; and libav code paths chosen at run time
(forced to plain C here), which changed the mp4 bytes before RGB -> YUV moved out of
libswscale, and, with busy threads, changed one macroblock once in a few dozen loaded runs
before the writers moved into a process of their own (docs/dataset.md, "Determinism").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

from flora.data.video import rgb_to_yuv420p
from tests.flips import repeated_difference

GENERATE = """
import hashlib, json, sys
from pathlib import Path
from flora.data.synth import generate
root = generate(Path(sys.argv[1]), 2, seed=11, durations_s=[5.0, 6.0], progress=False)
digest = {
    str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(root.rglob("*")) if p.is_file()
}
globals().get("finish", lambda: None)()
print("DIGEST " + json.dumps(digest))
"""

HEAVY_STACK = """
import os
import torch
torch.set_num_threads(1)
x = torch.randn(96, 96)
assert torch.isfinite(x @ x).all()
import transformers
cfg = transformers.BertConfig(
    vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=64,
)
with torch.no_grad():
    out = transformers.BertModel(cfg).eval()(torch.randint(0, 64, (2, 7)))
assert out.last_hidden_state.shape == (2, 7, 32)
import deepspeed  # noqa: F401
from flora.caption.judges import load_minilm
emb = load_minilm().encode(["pick up the red cube", "place it in the bowl"])
assert emb.shape == (2, 384)
# A library built with -ffast-math sets flush-to-zero / denormals-are-zero on load.
assert torch.set_flush_denormal(True)
"""

# Other threads of the same process keep two CPUs busy with the work a test session does
# beside generation: matrix products, threaded H.264 decoding + RGB conversion (libswscale
# with automatic threads) and a second encoder.
BUSY_THREADS = """
import tempfile, threading
import av, numpy as np, torch
from flora.data.synth import generate
from flora.data.video import VideoWriter
torch.set_num_threads(1)
stop = threading.Event()
scratch = tempfile.mkdtemp()
src = generate(scratch + "/src", 1, seed=5, durations_s=[5.0], progress=False)
clip = next(src.rglob("*.mp4"))
def matmul():
    x = torch.randn(160, 160)
    while not stop.is_set():
        x @ x
def decode():
    while not stop.is_set():
        with av.open(str(clip)) as c:
            c.streams.video[0].thread_type = "AUTO"
            for f in c.decode(video=0):
                f.to_ndarray(format="rgb24")
def encode():
    rng = np.random.default_rng(0)
    k = 0
    while not stop.is_set():
        with VideoWriter(f"{scratch}/busy{k % 2}.mp4", 20, 64, 64) as w:
            for _ in range(20):
                w.add(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
        k += 1
workers = [threading.Thread(target=f, daemon=True) for f in (matmul, decode, encode)]
for t in workers:
    t.start()
def finish():  # join before exit: torch aborts if a thread is still inside it
    stop.set()
    for t in workers:
        t.join()
"""

# libavutil's CPU-feature mask, forced to "none": every libav function that dispatches
# on it (libswscale's converters among them) runs its plain C version.
LIBAV_PLAIN_C = """
import ctypes, pathlib
import av
libs = sorted((pathlib.Path(av.__file__).parent.parent / "av.libs").glob("libavutil*.so*"))
assert libs, "PyAV's bundled libavutil not found"
avutil = ctypes.CDLL(str(libs[0]))
avutil.av_force_cpu_flags(0)
assert avutil.av_get_cpu_flags() == 0
"""


def _generate(prelude: str, out: Path) -> dict[str, str]:
    # The run's own temp files (the busy prelude's scratch videos) stay under pytest's
    # tmp, not in /tmp, where nothing would remove them.
    scratch = out.parent / "tmp"
    scratch.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TMPDIR": str(scratch)}
    proc = subprocess.run(
        [sys.executable, "-c", prelude + GENERATE, str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("DIGEST "))
    return json.loads(line[len("DIGEST ") :])


@pytest.fixture(scope="module")
def clean_digest(tmp_path_factory) -> dict[str, str]:
    return _generate("", tmp_path_factory.mktemp("clean") / "toy")


def _differing(clean: dict[str, str], prelude: str, tmp_path: Path) -> list[str]:
    """Files a run after ``prelude`` writes differently from a clean run — again in a
    second pair of fresh runs (tests/flips.py: not the rare byte flip)."""
    first = (clean, _generate(prelude, tmp_path / "toy"))
    assert sorted(first[0]) == sorted(first[1])

    def again() -> tuple[dict[str, str], dict[str, str]]:
        return _generate("", tmp_path / "clean2"), _generate(prelude, tmp_path / "toy2")

    return repeated_difference(first, again, "toy world after a prelude")


def test_same_bytes_after_the_heavy_stack(clean_digest, tmp_path):
    assert any(k.endswith(".mp4") for k in clean_digest)
    assert _differing(clean_digest, HEAVY_STACK, tmp_path) == []


def test_same_bytes_while_other_threads_work(clean_digest, tmp_path):
    assert _differing(clean_digest, BUSY_THREADS, tmp_path) == []


def test_same_bytes_when_libav_runs_plain_c(clean_digest, tmp_path):
    """Fails while frames go through libswscale: its C and SIMD conversions differ."""
    assert _differing(clean_digest, LIBAV_PLAIN_C, tmp_path) == []


def test_rgb_to_yuv420p_known_colours_and_chroma_mean():
    def conv(rgb) -> list[int]:
        img = np.zeros((2, 2, 3), np.uint8)
        img[:] = rgb
        return rgb_to_yuv420p(img).reshape(-1).tolist()

    assert conv((0, 0, 0)) == [16] * 4 + [128, 128]
    assert conv((255, 255, 255)) == [235] * 4 + [128, 128]
    assert conv((255, 0, 0)) == [82] * 4 + [90, 240]
    # Chroma is the rounded mean of the 2x2 block; luma is per pixel.
    img = np.array([[[255, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]]], np.uint8)
    y0, y1, y2, y3, u, v = rgb_to_yuv420p(img).reshape(-1).tolist()
    assert (y0, y1, y2, y3) == (82, 16, 16, 16)
    assert (u, v) == (119, 156)  # 128 + floor((-38 * 255 + 512) / 1024), likewise V
    with pytest.raises(ValueError):
        rgb_to_yuv420p(np.zeros((3, 4, 3), np.uint8))


def test_rgb_to_yuv420p_matches_libswscale_on_flat_colours():
    """Same colour convention as libswscale's default, so decoded colours stay put."""
    rng = np.random.default_rng(3)
    img = np.repeat(np.repeat(rng.integers(0, 256, (6, 6, 3), np.uint8), 16, 0), 16, 1)
    ours = rgb_to_yuv420p(img).astype(int)
    ref = av.VideoFrame.from_ndarray(img).reformat(format="yuv420p", threads=1).to_ndarray()
    interior = np.ones((96, 96), bool)  # away from block edges, where filters differ
    for k in range(1, 6):
        interior[16 * k - 2 : 16 * k + 2, :] = False
        interior[:, 16 * k - 2 : 16 * k + 2] = False
    assert np.abs(ours[:96] - ref[:96].astype(int))[interior].max() <= 1
    chroma_interior = interior[::2, ::2]
    for lo in (96, 120):  # U then V rows (each plane is 48x48, stored as 24 rows of 96)
        a = ours[lo : lo + 24].reshape(48, 48)
        b = ref[lo : lo + 24].astype(int).reshape(48, 48)
        assert np.abs(a - b)[chroma_interior].max() <= 1
