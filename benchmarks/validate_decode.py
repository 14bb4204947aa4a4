"""Raw-validation decode cost: every packet of each camera span vs first and last frame.

Issue 15 (finding 6): the raw validation used to decode only the first and the last frame
of each camera span, so an mp4 with its middle overwritten by random bytes passed. It now
decodes every packet of the span (``flora.validation.raw.decode_span``: demux + decode,
no RGB conversion). This times, on the demo toy world (10 episodes, 475 s, two 96x96
cameras at 20 fps = 19,000 frames; generated as ``make demo`` does unless ``--dataset``
names one):

- ``old``: the former check per camera — demux the span (``packet_index``) and decode the
  first and last frame to RGB (``sample_frames``);
- ``new``: ``decode_span`` per camera;
- ``validate``: the whole ``validate_dataset`` (reader, three GX suites, new check), once.

Best of ``--repeat`` rounds of wall and CPU (process) time; each round runs both checks,
so load from other processes hits them alike. Run:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/validate_decode.py [--dataset PATH]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/validate_decode.py --size 448
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flora.data import open_dataset  # noqa: E402
from flora.data.frames import sample_frames  # noqa: E402
from flora.data.video import open_video, packet_index  # noqa: E402
from flora.validation.raw import decode_span, validate_dataset  # noqa: E402


def old_check(cam, dataset: str, episode: int) -> int:
    """The former raw_cameras decode check (first and last frame); returns frames demuxed."""
    period = int(round(1_000_000 / cam.fps))
    with open_video(cam.path, dataset=dataset, episode=episode, field=cam.key) as c:
        pts, _, _, _ = packet_index(c, cam.file_start_us, cam.file_end_us)
    last = max(cam.file_end_us - cam.file_start_us - period, 0)
    sample_frames(cam, [0, last], dataset=dataset, episode=episode)
    return len(pts)


def new_check(cam, dataset: str, episode: int) -> int:
    """The current check: decode every packet of the span; returns frames decoded."""
    got = decode_span(cam, dataset=dataset, episode=episode)
    assert got.errors == 0 and got.decoded == len(got.pts_us)
    return got.decoded


def timed(fn, cams) -> tuple[float, float, int]:
    w0, c0 = time.perf_counter(), time.process_time()
    n = sum(fn(cam, ds, ep) for cam, ds, ep in cams)
    return time.perf_counter() - w0, time.process_time() - c0, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, default=None, help="Dataset (default: demo world).")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--size", type=int, default=0,
        help="Instead of the demo world: 2 episodes of 20 s with both cameras at SIZE².",
    )  # fmt: skip
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.dataset
        if root is None and args.size:
            from flora.data.synth import generate

            root = generate(Path(tmp) / f"toy_{args.size}", episodes=2, seed=0,
                            durations_s=(20.0, 20.0), image_size=args.size,
                            wrist_size=args.size, progress=False)  # fmt: skip
        if root is None:
            from flora.demo import DEMO_EPISODES, DEMO_SEED, generate_dataset

            root = Path(tmp) / "toy_world"
            generate_dataset(root, DEMO_EPISODES, DEMO_SEED)
        ds = open_dataset(root)
        cams = [(cam, ds.name, i) for i in ds.episode_indices()
                for cam in ds.episode(i).cameras.values()]  # fmt: skip
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(args.repeat):
            for name, fn in (("old", old_check), ("new", new_check)):
                r = timed(fn, cams)
                if name not in best or r[0] < best[name][0]:
                    best[name] = r
        w0, c0 = time.perf_counter(), time.process_time()
        report = validate_dataset(root, progress=False)
        full = (time.perf_counter() - w0, time.process_time() - c0)
        assert report.success, [i.describe() for i in report.issues]
    print(f"dataset {ds.name}: {len(ds.episode_indices())} episodes, {len(cams)} camera spans")
    print("| check | frames | wall s | CPU s | CPU µs/frame |")
    print("| --- | --- | --- | --- | --- |")
    frames = best["new"][2]
    for name, (wall, cpu, n) in best.items():
        print(f"| {name} | {n} | {wall:.2f} | {cpu:.2f} | {cpu / frames * 1e6:.1f} |")
    ratio = best["new"][1] / best["old"][1]
    print(f"new/old CPU: {ratio:.2f}x; validate_dataset total: {full[0]:.2f} s wall, "
          f"{full[1]:.2f} s CPU")  # fmt: skip


if __name__ == "__main__":
    main()
