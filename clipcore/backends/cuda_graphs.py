"""torch fp16 with the image tower replayed from CUDA graphs (``backend="torch-graphs"``, CUDA only).

On a GPU a small CLIP image tower is bound by kernel launches at small batches: fp16 autocast is
slower than fp32 at batch 1 and 8 on an H200 (docs/benchmarks-notebook.md, "GPU") and 4x faster at 128.
A CUDA graph records the tower's kernels once per input shape and replays them with one launch.
The batcher forms any batch size from 1 to its maximum, so batches are padded to a bucket (a power
of two, up to the maximum batch, which is a bucket too) and one graph is captured per bucket when
the towers are built: at most ``log2(max_batch) + 2`` graphs, each with its own memory pool (the
activations of one batch of that size). A batch larger than the largest bucket is split. The
padding rows hold whatever the previous batch left (real pixels or zeros) and are dropped; images
do not interact in the tower, so they change nothing.

The graphs capture the same computation as ``TorchTowers`` under fp16 autocast (pixels uploaded
as uint8 and normalised on the GPU, autocast without its weight-cast cache, which graph capture
does not allow), and the version is gated like every backend (``require_parity``). The text towers
run fp16 autocast eagerly. ``torch.compile(mode="reduce-overhead")`` builds CUDA graphs too, with
kernel fusion on top; it compiles each shape for tens of seconds at start, so the service captures
eager graphs (milliseconds each) and ``loadtests/bench_cuda.py`` times both.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from clipcore.backends.torch_towers import TorchTowers
from clipcore.models.bundle import ModelBundle
from clipcore.models.clip_model import image_features, normalize

# (function of the static input, static input) -> replay (runs the function on the static input's
# current contents and returns its static output).
Capture = Callable[[Callable[[torch.Tensor], torch.Tensor], torch.Tensor], Callable[[], torch.Tensor]]
WARMUP_CALLS = 3  # before capture, on a side stream: lazy initialisation and allocator warm-up


def buckets(max_batch: int) -> tuple[int, ...]:
    """The batch sizes graphs are captured for: powers of two below ``max_batch``, and ``max_batch``."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    sizes.append(max(1, max_batch))
    return tuple(sizes)


def bucket_for(n: int, sizes: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``n`` images (``n`` at most the largest bucket)."""
    return next(b for b in sizes if b >= n)


def capture_cuda_graph(
    fn: Callable[[torch.Tensor], torch.Tensor], static_in: torch.Tensor
) -> Callable[[], torch.Tensor]:
    """Record ``fn(static_in)`` as a CUDA graph (after warm-up calls on a side stream, as the CUDA
    graphs documentation prescribes); the returned replay reruns it on ``static_in``'s contents."""
    side = torch.cuda.Stream(device=static_in.device)
    side.wait_stream(torch.cuda.current_stream(static_in.device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            fn(static_in)
    torch.cuda.current_stream(static_in.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: another version's model thread may use the GPU while this one captures.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        static_out = fn(static_in)

    def replay() -> torch.Tensor:
        graph.replay()
        return static_out

    return replay


class GraphedTorchTowers(TorchTowers):
    """The version's torch towers under autocast (fp16 by default), the image tower replayed from one
    CUDA graph per bucket. ``capture`` records a graph; the default is CUDA's (tests pass one that
    calls the function directly, to check the padding and splitting on a CPU)."""

    def __init__(
        self,
        bundle: ModelBundle,
        max_batch: int,
        dtype: torch.dtype | None = torch.float16,
        capture: Capture | None = None,
    ) -> None:
        super().__init__(bundle, dtype)
        self.buckets = buckets(max_batch)
        dev = torch.device(bundle.device)
        self._mean = torch.tensor(bundle.mean, dtype=torch.float32, device=dev).view(1, 3, 1, 1)
        self._std = torch.tensor(bundle.std, dtype=torch.float32, device=dev).view(1, 3, 1, 1)
        record = capture or capture_cuda_graph
        size = bundle.image_size
        self._graphs: dict[int, tuple[torch.Tensor, Callable[[], torch.Tensor]]] = {}
        for b in self.buckets:
            static_in = torch.zeros((b, size, size, 3), dtype=torch.uint8, device=dev)
            self._graphs[b] = (static_in, record(self._forward, static_in))

    @torch.no_grad()
    def _forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, S, S, 3) uint8 on the device -> (B, D) normalised fp32 features."""
        x = (pixels.permute(0, 3, 1, 2).float().div(255.0) - self._mean) / self._std
        if self.dtype is None:
            features = image_features(self.bundle.model, x)[0]
        else:
            # cache_enabled=False: autocast's weight-cast cache cannot live across a graph capture.
            with torch.autocast(x.device.type, dtype=self.dtype, cache_enabled=False):
                features = image_features(self.bundle.model, x)[0]
        return normalize(features.float())

    def encode_images(self, images: np.ndarray) -> np.ndarray:
        largest = self.buckets[-1]
        out = []
        for start in range(0, len(images), largest):
            chunk = np.require(images[start : start + largest], requirements=["C", "W"])  # cached arrays are read-only
            n = len(chunk)
            static_in, replay = self._graphs[bucket_for(n, self.buckets)]
            static_in[:n].copy_(torch.from_numpy(chunk))
            out.append(replay()[:n].cpu().numpy())  # .cpu() copies the static output before the next replay
        if not out:
            return np.zeros((0, 0), dtype=np.float32)
        return np.concatenate(out)
