"""An int8 copy of the output item matrix, for candidates with certified score bounds
(``int8_scores.c``; the inference engine uses it through :mod:`gru4rec.inference.scoring`).

:class:`Int8Table` quantises the rows of ``Wy`` once — ``w_i = c_i q_i + e_i`` with ``q_i`` in
[−127, 127] — into the kernel's blocked layout (16 items × 4 columns per 64 bytes, see
``int8_scores.c``), and keeps, rounded up, the norms the bound needs: the residual norm
``||e_i||``, ``||c_i q_i||`` and ``||w_i||``. :meth:`Int8Table.candidates` returns, per query
row, the ``m`` items with the largest upper bounds on their float32 score (every other item's
bound is at most the smallest of those); :meth:`Int8Table.rescore` their exact scores and lower
bounds; :meth:`Int8Table.topk` — what serving calls — does both, the exclusions and the
certification in one call. :func:`int8_kernels` builds and loads the library once per process;
None when it cannot be built (serving then scores in float32 alone, with the same answers).
"""
from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gru4rec.kernels.build import KernelBuildError, build_library

__all__ = ["CertifiedRows", "Int8Kernels", "Int8Table", "int8_kernels", "load_int8_kernels"]

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("int8_scores.c")
_p, _i64 = ctypes.c_void_p, ctypes.c_int64
_CHUNK = 4096
#: Items per block of the kernel's table layout (``BLOCK`` in int8_scores.c).
BLOCK = 16


class Int8Kernels:
    """The functions of ``int8_scores.c``, with their C signatures declared once. ``simd`` names
    the product code the compiler built: ``'avx512-vnni'``, ``'avx2'`` or ``'scalar'``."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self.candidates = lib.g4r_int8_candidates
        self.candidates.argtypes = [_i64, _i64, _i64, _i64, _i64, _p, _p, _p, _p, _p, _p, _p, _p, _p]
        self.candidates.restype = ctypes.c_int
        self.rescore = lib.g4r_rescore
        self.rescore.argtypes = [_i64, _i64, _i64, _p, _p, _p, _p, _p, _p, _p]
        self.rescore.restype = None
        self.certified_topk = lib.g4r_certified_topk
        self.certified_topk.argtypes = [_i64, _i64, _i64, _i64, _i64, _p, _p, _p, _p, _p, _p, _p, _p, _p, _i64, _p, _p, _p, _p, _p]
        self.certified_topk.restype = ctypes.c_int
        lib.g4r_int8_path.restype = ctypes.c_char_p
        self.simd: str = lib.g4r_int8_path().decode()


def _round_up_f32(values: Tensor) -> Tensor:
    """float64 values as the nearest float32 at or above each (a norm must never shrink)."""
    f = values.to(torch.float32)
    return torch.where(f.double() < values, torch.nextafter(f, torch.tensor(float("inf"))), f)


@dataclass
class CertifiedRows:
    """:meth:`Int8Table.topk`'s answer: per row the best candidates by exact score (B×kmax item
    indices and float32 scores, best first; −1 / −inf where fewer remain) and whether the row is
    certified (its top k is then the float32 top k of all items)."""

    indices: np.ndarray
    scores: np.ndarray
    certified: np.ndarray


class Int8Table:
    """The int8 copy of a float32 item matrix ``w`` (N×L) with bias ``bias`` (N), and the exact
    float32 matrix it rescores from (referenced, not copied: it must not change)."""

    def __init__(self, kernels: Int8Kernels, w: Tensor, bias: Tensor) -> None:
        if w.dtype != torch.float32 or w.device.type != "cpu" or w.dim() != 2:
            raise ValueError("Int8Table needs a float32 CPU matrix (N x L)")
        if not bool(torch.isfinite(w).all()) or not bool(torch.isfinite(bias).all()):
            raise ValueError("the item matrix has non-finite values: no int8 bounds for it")
        self._k = kernels
        self.w = w.detach().contiguous()
        self.n_items, self.width = self.w.shape
        n_blocks, groups = -(-self.n_items // BLOCK), -(-self.width // 4)
        padded = n_blocks * BLOCK
        # q_i + 128 as unsigned bytes (the kernel's products take an unsigned operand), padded
        # with 128 (q = 0) to whole blocks and whole groups of 4 columns.
        u = torch.full((padded, 4 * groups), 128, dtype=torch.uint8)
        # Per item, padded to whole blocks (the kernel bounds 16 items at a time; padding is never a candidate).
        self.scale, self.residual, self.qhat_norm, self.w_norm, self.bias = (torch.zeros(padded) for _ in range(5))
        self.bias[: self.n_items] = bias.detach()
        for start in range(0, self.n_items, _CHUNK):  # in slices: the float64 copies stay small
            rows = slice(start, min(start + _CHUNK, self.n_items))
            w = self.w[rows]
            amax = w.abs().amax(dim=1)
            scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
            q = torch.round(w / scale[:, None]).clamp_(-127, 127)
            w64, qhat = w.double(), q.double() * scale.double()[:, None]
            u[rows, : self.width] = (q + 128).to(torch.uint8)
            self.scale[rows] = scale
            self.residual[rows] = _round_up_f32(torch.linalg.vector_norm(w64 - qhat, dim=1))
            self.qhat_norm[rows] = _round_up_f32(torch.linalg.vector_norm(qhat, dim=1))
            self.w_norm[rows] = _round_up_f32(torch.linalg.vector_norm(w64, dim=1))
        # Blocked: [block, group of 4 columns, item of the block, column of the group].
        self.q = u.view(n_blocks, BLOCK, groups, 4).permute(0, 2, 1, 3).contiguous()

    def _query(self, x: Tensor) -> Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or x.shape[1] != self.width:
            raise ValueError(f"queries must be a float32 CPU matrix with {self.width} columns, got {x.dtype} {tuple(x.shape)}")
        return x.contiguous()

    def candidates(self, x: Tensor, m: int) -> tuple[Tensor, Tensor]:
        """For each row of ``x`` (B×L): the ``m`` items with the largest upper bounds on their
        float32 score ``x·w_i + b_i`` (indices B×m int64, bounds B×m float32, in no order).
        Every item not returned has a bound at most the row's smallest returned bound."""
        x = self._query(x)
        if not 1 <= m <= self.n_items:
            raise ValueError(f"m must be between 1 and {self.n_items}, got {m}")
        B = x.shape[0]
        idx = torch.empty(B, m, dtype=torch.int64)
        upper = torch.empty(B, m, dtype=torch.float32)
        if B == 0:
            return idx, upper
        status = self._k.candidates(
            B, self.width, self.n_items, m, torch.get_num_threads(), x.data_ptr(), self.q.data_ptr(),
            self.scale.data_ptr(), self.bias.data_ptr(), self.residual.data_ptr(), self.qhat_norm.data_ptr(),
            self.w_norm.data_ptr(), idx.data_ptr(), upper.data_ptr(),
        )
        if status != 0:
            raise MemoryError("int8 candidates: out of memory for the selection heaps")
        return idx, upper

    def rescore(self, x: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
        """Exact scores of the items ``idx`` (B×m, from :meth:`candidates`) for the rows of
        ``x``, and lower bounds on the float32 scores ``x·w_i + b_i`` that a float32 product
        computes (B×m each)."""
        x = self._query(x)
        if idx.dtype != torch.int64 or idx.dim() != 2 or idx.shape[0] != x.shape[0]:
            raise ValueError("idx must be an int64 matrix with one row per query")
        idx = idx.contiguous()
        if idx.numel() and (int(idx.max()) >= self.n_items or int(idx.min()) < -1):
            raise ValueError(f"idx holds indices outside 0..{self.n_items - 1}")
        score = torch.empty(idx.shape, dtype=torch.float32)
        lower = torch.empty(idx.shape, dtype=torch.float32)
        if idx.numel():
            self._k.rescore(x.shape[0], self.width, idx.shape[1], x.data_ptr(), self.w.data_ptr(), self.bias.data_ptr(),
                            self.w_norm.data_ptr(), idx.data_ptr(), score.data_ptr(), lower.data_ptr())
        return score, lower


    def topk(self, x: Tensor, ks: Sequence[int], exclude_items: np.ndarray, exclude_offsets: np.ndarray, m: int) -> CertifiedRows:
        """Candidates, exact rescoring, exclusions and certification in one kernel call (no
        Python or torch work per step in between): for each row of ``x`` the best ``max(ks)``
        of its ``m`` candidates that are not among its excluded items
        (``exclude_items[exclude_offsets[row]:exclude_offsets[row + 1]]``), and whether at least
        ``ks[row]`` of them are proven to beat every item outside the candidates."""
        x = self._query(x)
        B, kmax = x.shape[0], max(ks, default=1)
        if not 1 <= kmax <= m <= self.n_items or len(ks) != B or len(exclude_offsets) != B + 1 or min(ks, default=1) < 1:
            raise ValueError(f"need one k >= 1 and one exclusion list per row and max(k) <= m <= {self.n_items}")
        starts = np.ascontiguousarray(exclude_offsets, dtype=np.int64)
        # a fresh array: the kernel sorts each row's exclusions in place
        items = np.array(exclude_items, dtype=np.int64) if starts[-1] else np.zeros(1, np.int64)
        ks_arr = np.asarray(ks, dtype=np.int64)
        indices = np.empty((B, kmax), dtype=np.int64)
        scores = np.empty((B, kmax), dtype=np.float32)
        certified = np.zeros(B, dtype=np.uint8)
        if B == 0:
            return CertifiedRows(indices, scores, certified.astype(bool))
        status = self._k.certified_topk(
            B, self.width, self.n_items, m, torch.get_num_threads(), x.data_ptr(), self.q.data_ptr(),
            self.scale.data_ptr(), self.bias.data_ptr(), self.residual.data_ptr(), self.qhat_norm.data_ptr(),
            self.w_norm.data_ptr(), self.w.data_ptr(), ks_arr.ctypes.data, kmax, starts.ctypes.data, items.ctypes.data,
            indices.ctypes.data, scores.ctypes.data, certified.ctypes.data,
        )
        if status != 0:
            raise MemoryError("int8 top-k: out of memory for the candidates")
        return CertifiedRows(indices, scores, certified.view(bool))


def load_int8_kernels(cache_dir: Path | None = None, compiler: str | None = None, *,
                      flag_sets: tuple[list[str], ...] | None = None) -> Int8Kernels:
    """Build ``int8_scores.c`` (unless the cache has this build; ``flag_sets`` as in
    :func:`~gru4rec.kernels.build.build_library`) and load it. Raises :class:`KernelBuildError`
    saying why when it cannot."""
    target = build_library(cache_dir, compiler, sources=(_SOURCE,), flag_sets=flag_sets)
    try:
        return Int8Kernels(ctypes.CDLL(str(target)), target)
    except (OSError, AttributeError) as exc:
        raise KernelBuildError(f"cannot load {target}: {exc}") from None


_kernels: Int8Kernels | None = None
_reason: str | None = None
_loaded = False


def int8_kernels() -> tuple[Int8Kernels | None, str | None]:
    """The kernels, built and loaded once per process, or None and the reason they cannot be."""
    global _kernels, _reason, _loaded
    if not _loaded:
        _loaded = True
        try:
            _kernels = load_int8_kernels()
        except KernelBuildError as exc:
            _reason = str(exc)
    return _kernels, _reason
