"""The decode step's work between its matrix multiplies in native calls (`decode_kernels.c`): attention
in one call per layer, RMSNorm, rotary embedding and the MLP's silu(gate) * up; and the sampler's
draw for rows that truncate nothing (`sample_rows`). Built on first use with the machine's C
compiler and loaded with ctypes.

Measured at 64 rows of SmolLM2-135M (docs/benchmarks.md): attention as two batched matrix
multiplies is 11,520 small multiplies a step whose per-call cost, not the arithmetic, made it about
a sixth of the step; and the norms, rotary embedding, activation and residual adds were about 25
small tensor operations a layer, each a pass over memory and a dispatch. The kernels walk the
rows' keys and values in place (the cache's strided views), once per key-value head for every
query head of its group, split over the engine's threads, and do each elementwise part in one pass.
`decode_layers` runs the whole step after the embedding lookup in one call: every layer, the final
norm and the head, its matrix multiplies through the BLAS `sgemm_` torch's own `torch.mm` calls (MKL,
found in the process's libtorch_cpu, `blas_sgemm`), so the step's 200-odd multiplies and 300-odd
small calls are no longer Python round trips (they were about a tenth of the step at 64 rows).

They are used for float32 on the CPU with caches whose last dimension is contiguous; anything
else, or a machine without a C compiler (logged once), keeps the tensor operations
(`decode_step.LlamaDecode` with `native=False`), which compute the same to float rounding
(tests/integration/test_decode_step.py compares them).

The library is cached under $XDG_CACHE_HOME/agentrl/kernels (default ~/.cache), keyed by the
source, the compiler and the CPU's flags (it is built with -march=native), written to a
temporary name and renamed into place, so processes building at once do not collide.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_kernels.c")
FLAGS = ("-O3", "-march=native", "-ffast-math", "-shared", "-fPIC", "-fopenmp")
_lock = threading.Lock()
_loaded: dict[str, object] = {}  # "lib": the Kernels, or None once building failed


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentrl" / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), version, _cpu_flags(), *FLAGS]).encode()).hexdigest()[:16]
    lib = _cache_dir() / f"decode_kernels-{key}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_name(f".{lib.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        proc = subprocess.run([cc, *FLAGS, "-o", str(tmp), str(SOURCE), "-lm"], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise OSError(f"{cc} cannot compile {SOURCE.name}: {proc.stderr.strip()[-300:]}")
        os.replace(tmp, lib)
    finally:
        tmp.unlink(missing_ok=True)
    return lib


class Kernels:
    """The library's functions with their argument types."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
        self.decode_attend = lib.decode_attend
        self.decode_attend.restype = i32
        self.decode_attend.argtypes = [ptr] * 6 + [i64] * 6 + [i32] * 5 + [f32, i32, i32]
        self.rms_norm = lib.rms_norm
        self.rms_norm.restype = None
        self.rms_norm.argtypes = [ptr] * 3 + [i32, i32, f32]
        self.rope = lib.rope
        self.rope.restype = None
        self.rope.argtypes = [ptr] * 3 + [i32] * 3 + [i64]
        self.silu_mul = lib.silu_mul
        self.silu_mul.restype = None
        self.silu_mul.argtypes = [ptr, ptr, i64]
        self.sample_rows = lib.sample_rows
        self.sample_rows.restype = None
        self.sample_rows.argtypes = [ptr, ptr, i32, i32, ptr, ptr, ptr, i32]
        self.decode_layers = lib.decode_layers
        self.decode_layers.restype = i32
        self.decode_layers.argtypes = [ptr, ptr, i32] + [ptr] * 12 + [ptr, f32, ptr, ptr, ptr] + [i32] * 9 + [f32, i32, i32]


class Layer(ctypes.Structure):
    """decode_kernels.c's `layer_t`: one layer's parameters (0 for a bias the module has not) and its
    cache view (first element, element strides of rows, heads and columns)."""

    _fields_ = ([(name, ctypes.c_void_p) for name in ("ln1", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "ln2",
                                                       "wg", "bg", "wu", "bu", "wd", "bd", "k", "v")]
                + [(name, ctypes.c_long) for name in ("ks0", "ks1", "ks2", "vs0", "vs1", "vs2")]
                + [("eps1", ctypes.c_float), ("eps2", ctypes.c_float)])


def kernel() -> Kernels | None:
    """The loaded kernels, building them the first time; None when they cannot be built."""
    if "lib" in _loaded:
        return _loaded["lib"]
    with _lock:
        if "lib" in _loaded:
            return _loaded["lib"]
        cc = shutil.which("cc") or shutil.which("gcc")
        try:
            if cc is None:
                raise OSError("no C compiler (cc) on PATH")
            lib = Kernels(ctypes.CDLL(str(_build(cc))))
        except (OSError, AttributeError, subprocess.SubprocessError) as exc:
            log.warning("the decode step runs on tensor operations (slower at many rows): %s", exc)
            lib = None
        _loaded["lib"] = lib
        return lib


def blas_sgemm() -> int | None:
    """The address of the Fortran `sgemm_` that `torch.mm` multiplies float32 with on the CPU: MKL's,
    exported by the process's libtorch_cpu. Checked once against `torch.mm` on a small product; None
    (logged once) where torch has no MKL, the symbol is missing or the check fails; then the step
    keeps its multiplies in torch."""
    if "sgemm" in _loaded:
        return _loaded["sgemm"]
    with _lock:
        if "sgemm" not in _loaded:
            _loaded["sgemm"] = _find_sgemm()
        return _loaded["sgemm"]


def _find_sgemm() -> int | None:
    i32p, f32p = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_float)
    try:
        if not torch.backends.mkl.is_available():
            raise OSError("torch was built without MKL")
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        addr = ctypes.cast(lib.sgemm_, ctypes.c_void_p).value
        call = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, i32p, i32p, i32p, f32p, ctypes.c_void_p, i32p,
                                ctypes.c_void_p, i32p, f32p, ctypes.c_void_p, i32p)(addr)
        gen = torch.Generator().manual_seed(0)
        x, w = torch.randn(3, 5, generator=gen), torch.randn(4, 5, generator=gen)
        y = torch.zeros(3, 4)
        n = lambda v: ctypes.byref(ctypes.c_int(v))  # noqa: E731
        call(b"T", b"N", n(4), n(3), n(5), ctypes.byref(ctypes.c_float(1.0)), w.data_ptr(), n(5), x.data_ptr(), n(5),
             ctypes.byref(ctypes.c_float(0.0)), y.data_ptr(), n(4))
        if not torch.allclose(y, x @ w.t(), atol=1e-5):
            raise OSError("libtorch_cpu's sgemm_ does not compute x @ w.T")
        return addr
    except (OSError, AttributeError) as exc:
        log.warning("the decode step keeps its matrix multiplies in torch (one call each): %s", exc)
        return None


def usable(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether the kernel takes these: float32 on the CPU, keys and values [rows, kv_heads, cols, dim]
    with a contiguous last dimension."""
    return (q.dtype == keys.dtype == values.dtype == torch.float32 and q.device.type == keys.device.type == "cpu"
            and keys.dim() == 4 and keys.stride(-1) == 1 and values.stride(-1) == 1 and keys.shape == values.shape)


def check_shared(shared: torch.Tensor, rows: int, cols: int) -> None:
    """ValueError unless `shared` is [rows, 3] contiguous int32 of (source row, lo, hi) with a source
    row of the batch and 0 <= lo <= hi <= cols: the kernels read the source row's columns [lo, hi)."""
    if shared.dtype != torch.int32 or tuple(shared.shape) != (rows, 3) or not shared.is_contiguous():
        raise ValueError(f"shared: {shared.dtype} {tuple(shared.shape)} is not contiguous int32 [{rows}, 3]")
    src, lo, hi = shared.unbind(1)
    if bool((src < 0).any() | (src >= rows).any() | (lo < 0).any() | (lo > hi).any() | (hi > cols).any()):
        raise ValueError(f"shared: a row's source is outside the {rows} rows or its columns outside 0..{cols}")


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float,
           lib: Kernels, out: torch.Tensor | None = None, shared: torch.Tensor | None = None) -> torch.Tensor | None:
    """Attention of `q` [rows, heads, dim] over `keys`/`values` [rows, kv_heads, cols, dim] where `mask`
    [rows, cols] (bool, uint8) is true -> [rows, heads, dim] (into `out`, contiguous, if given); None
    when the native call failed. `shared` (checked by `check_shared`): each row's columns [lo, hi)
    read from its source row, which holds the same values."""
    rows, heads, dim = q.shape
    kv_heads, cols = keys.shape[1], keys.shape[2]
    if keys.shape[0] != rows or keys.shape[3] != dim or heads % kv_heads or tuple(mask.shape) != (rows, cols):
        raise ValueError(f"attend: q {tuple(q.shape)}, keys {tuple(keys.shape)} and mask {tuple(mask.shape)} do not fit")
    q = q.contiguous()
    mask = mask.to(torch.uint8).contiguous()
    out = torch.empty_like(q) if out is None else out
    if shared is not None:
        check_shared(shared, rows, cols)
    rc = lib.decode_attend(q.data_ptr(), keys.data_ptr(), values.data_ptr(), mask.data_ptr(),
                           None if shared is None else shared.data_ptr(), out.data_ptr(),
                           *keys.stride()[:3], *values.stride()[:3], rows, heads, kv_heads, cols, dim, scale,
                           torch.get_num_threads(), 1)
    return out if rc == 0 else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, lib: Kernels, out: torch.Tensor | None = None) -> torch.Tensor:
    """Llama's RMSNorm of `x` [rows, dim] (contiguous float32) with `weight` [dim], into `out` (a new
    tensor if None)."""
    out = torch.empty_like(x) if out is None else out
    if x.dim() != 2 or not (x.is_contiguous() and out.is_contiguous()) or out.shape != x.shape or weight.shape != (x.shape[1],):
        raise ValueError(f"rms_norm: x {tuple(x.shape)}, weight {tuple(weight.shape)} and out {tuple(out.shape)} do not fit")
    lib.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps)
    return out


def rope_(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor, lib: Kernels) -> torch.Tensor:
    """Rotary embedding in place on `x` [rows, heads * dim] (heads contiguous within a row, rows strided),
    with `cos`/`sin` [rows, dim] contiguous; returns `x`."""
    rows, dim = x.shape[0], cos.shape[-1]
    if x.shape[1] != heads * dim or x.stride(1) != 1 or tuple(cos.shape) != (rows, dim) or cos.shape != sin.shape:
        raise ValueError(f"rope_: x {tuple(x.shape)} is not [rows, {heads} x {dim}], or cos/sin {tuple(cos.shape)} do not fit")
    lib.rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), rows, heads, dim, x.stride(0))
    return x


def silu_mul_(gate: torch.Tensor, up: torch.Tensor, lib: Kernels) -> torch.Tensor:
    """`gate` = silu(gate) * up in place (both contiguous, same shape); returns `gate`."""
    if gate.shape != up.shape or not (gate.is_contiguous() and up.is_contiguous()):
        raise ValueError(f"silu_mul_: gate {tuple(gate.shape)} and up {tuple(up.shape)} are not contiguous and alike")
    lib.silu_mul(gate.data_ptr(), up.data_ptr(), gate.numel())
    return gate


def sample_rows(scaled: torch.Tensor, u: torch.Tensor, lib: Kernels) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per row of `scaled` [rows, vocab] (contiguous float32 logits, temperature applied) by
    inverse CDF at `u` [rows] of the row's total, and the drawn token's log-softmax -> (tokens int64,
    log-probs float32), in one pass for the maximum, one for the weights and their block sums and
    one walk; what `sampling.BatchSampler` does in tensor operations for rows that truncate nothing."""
    rows, vocab = scaled.shape
    if tuple(u.shape) != (rows,) or not scaled.is_contiguous():
        raise ValueError(f"sample_rows: logits {tuple(scaled.shape)} (contiguous) and uniforms {tuple(u.shape)} do not fit")
    threads = max(1, min(torch.get_num_threads(), rows))
    tokens = torch.empty(rows, dtype=torch.long)
    logprobs = torch.empty(rows, dtype=torch.float32)
    scratch = torch.empty(threads * vocab, dtype=torch.float32)
    u = u.to(torch.float32).contiguous()
    lib.sample_rows(scaled.data_ptr(), u.data_ptr(), rows, vocab, tokens.data_ptr(), logprobs.data_ptr(),
                    scratch.data_ptr(), threads)
    return tokens, logprobs
