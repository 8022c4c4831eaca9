"""Training: one step (:class:`Trainer`) and the epoch loop (:func:`train_epochs`).

A step, for B slots and S shared samples (spec §3–§6):

1. zero the hidden state of slots that start a new session;
2. gather the rows the step touches — input rows (B×d₀), candidate rows ``Wy[cols]`` (C×L) and
   ``By[cols]`` (C), cols = [targets (B), samples (S)] — so that gradients exist for those rows
   only (never an N-row dense gradient);
3. run the GRU layers (dropout in training), score B×C, subtract logQ, compute the loss;
4. backpropagate one step (the carried hidden state is a constant) and update: dense parameters
   as a whole, item tables at the gathered rows (:mod:`gru4rec.training.optim`).

Two implementations of the step: the default one writes the backward pass out by hand (closed-form
dL/dscores per loss, the GRU cell's derivative), the reference one (``reference=True``) lets
autograd do it; tests hold them equal. Nothing in a step leaves the device or is built from host
data: the schedule and the samples are device tensors prepared per epoch/store, and the loss is
accumulated on the device and read twice a second at most (progress, NaN check).
"""
from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch
from torch import Tensor

from gru4rec.training.batching import Schedule, build_schedule
from gru4rec.config import Config
from gru4rec.errors import ConfigError, TrainingDivergedError
from gru4rec.kernels.cpu_features import cpu_has_bf16_matmul
from gru4rec.kernels.memory import keep_freed_memory
from gru4rec.kernels.gpu import cuda_graphs_enabled, graphed_epoch_runner
from gru4rec.training.losses import MASK, make_loss, make_loss_grad
from gru4rec.model import GRU4RecNet
from gru4rec.training.optim import Optimizer, SparseGrad, UniqueGrad
from gru4rec.training.sampling import SampleStore

__all__ = ["Trainer", "EpochStats", "Matmuls", "PRECISIONS", "check_precision", "train_epochs"]


#: Training precisions: ``float32`` (default) or ``bfloat16`` operands for the step's matrix
#: products. (No float16: its 5-bit exponent would need loss scaling for the small gradients of
#: the score matrix; bfloat16 keeps float32's range, and GPUs multiply both at the same speed.)
PRECISIONS = ("float32", "bfloat16")


def check_precision(precision: str, device: torch.device, reference: bool = False, *, warn: bool = True) -> torch.dtype | None:
    """The 16-bit operand type of ``precision`` (None for float32); ConfigError when ``precision``
    is unknown or does not apply (the reference step); with ``warn``, a warning where it would be
    slow (the :class:`Trainer` warns; an early check of the name passes ``warn=False``)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "float32":
        return None
    if reference:
        raise ConfigError(f"precision={precision!r} is a mode of the fast training step; the reference step runs in float32 only")
    if warn and precision == "bfloat16" and device.type == "cpu" and cpu_has_bf16_matmul() is False:
        warnings.warn(
            "precision='bfloat16': this CPU has no bfloat16 matrix instructions (AVX-512 BF16 or AMX), "
            "so the products are emulated and training is many times slower than in float32 "
            "(23x for the diginetica configuration on an AVX2-only AMD EPYC); use precision='float32' here",
            stacklevel=3,
        )
    return torch.bfloat16


class Matmuls:
    """The training step's matrix products, in the parameters' type or in mixed precision.

    With ``low`` = None every method is the plain float32 operation and ``cast`` returns its
    argument. With ``low`` = bfloat16 the step casts each operand once (``cast``) and the
    products run on the 16-bit copies (with float32 accumulation inside the BLAS); results come
    back as float32, so the bias, the softmax/log-sum-exp of the loss, the gates and the optimiser
    work in float32 on float32 master weights. On GPUs this uses the tensor cores; on CPUs with
    AVX-512 BF16 (or AMX) bfloat16 products are several times faster than float32 ones.
    """

    def __init__(self, low: torch.dtype | None, dtype: torch.dtype) -> None:
        self.low, self.dtype = low, dtype

    def cast(self, t: Tensor) -> Tensor:
        return t if self.low is None else t.to(self.low)

    def mm(self, a: Tensor, b: Tensor) -> Tensor:
        out = torch.mm(a, b)
        return out if self.low is None else out.to(self.dtype)

    def addmm(self, bias: Tensor, a: Tensor, b: Tensor) -> Tensor:
        if self.low is None:
            return torch.addmm(bias, a, b)
        return torch.mm(a, b).to(self.dtype).add_(bias)

    def mm_into(self, out: Tensor, a: Tensor, b: Tensor) -> None:
        if self.low is None:
            torch.mm(a, b, out=out)
        else:
            out.copy_(torch.mm(a, b))


class ScoreRows(NamedTuple):
    """The Wy rows of a step's products where they are its distinct items (see
    :meth:`Trainer._score_rows`): ``uniq[:n_scored]`` are the items of the C score columns,
    ``col_rows`` (C) the row of each column; in shared mode ``uniq[n_scored:]`` are the items
    that are only inputs and ``input_rows`` (B) the row of each input (None otherwise)."""

    uniq: Tensor
    n_scored: int
    col_rows: Tensor
    input_rows: Tensor | None


class Trainer:
    """Owns the training state of a network: hidden states, optimiser, samples, dropout RNG."""

    def __init__(
        self,
        net: GRU4RecNet,
        config: Config,
        item_support: np.ndarray,
        *,
        seed: int | None = None,
        reference: bool = False,
        unique_rows: bool | None = None,
        precision: str = "float32",
        cpu_kernels: bool | None = None,
    ) -> None:
        """``reference``: use the plain autograd step. ``unique_rows``: how the optimiser merges
        duplicate rows (default: by device, see :class:`~gru4rec.training.optim.Optimizer`).
        ``precision``: see :data:`PRECISIONS`. ``cpu_kernels``: False runs the optimiser and the
        per-item gradient sums as PyTorch code even where the fused CPU kernels apply."""
        self.net = net
        self.config = config
        seed = config.seed if seed is None else seed
        p = net.Wy
        self.device, self.dtype = p.device, p.dtype
        if self.device.type == "cpu":
            keep_freed_memory()  # per-step temporaries of megabytes must not page-fault (gru4rec.kernels.memory)
        self.batch_size = B = config.batch_size
        self.n_sample = config.n_sample
        self.loss_fn = make_loss(config)
        #: True: the plain autograd step (the reference the fast step is tested against).
        self.reference = reference
        self._mask_in_bias = config.loss in ("cross-entropy", "xe_logit")
        self.optimizer = Optimizer(net.dense_parameters(), net.sparse_parameters(), config, unique_rows=unique_rows, kernels=cpu_kernels)
        # the fused CPU kernels (where the optimiser has them) also compute the fast step's loss
        self.loss_grad = make_loss_grad(config, None if reference else self.optimizer.kernels)
        self._dense = list(self.optimizer.dense.values())
        self.hidden = net.init_hidden(B)
        self.sampler = (
            SampleStore(item_support, config.sample_alpha, config.n_sample, config.sample_store_size, self.device, seed=seed + 1)
            if config.n_sample > 0
            else None
        )
        self._no_samples = torch.empty(0, dtype=torch.int64, device=self.device)
        self._ones_s = torch.ones(config.n_sample, device=self.device, dtype=self.dtype)
        support = torch.as_tensor(np.asarray(item_support, dtype=np.float64), device=self.device)
        log_support = torch.log(support).to(self.dtype)
        # logQ (§4): in-batch columns −logq·log supp, sampled columns −logq·alpha·log supp.
        self.logq_in = config.logq * log_support if config.logq > 0 else None
        self.logq_sample = config.logq * config.sample_alpha * log_support if config.logq > 0 else None
        # Dropout masks are drawn in place into fixed buffers from the trainer's own generator.
        self.dropout_gen = torch.Generator(device=self.device)
        self.dropout_gen.manual_seed(seed + 2)
        d0 = net.input_table.shape[1]
        self._embed_mask = torch.empty(B, d0, device=self.device, dtype=self.dtype) if net.dropout_p_embed > 0 else None
        self._hidden_masks = (
            [torch.empty(B, n, device=self.device, dtype=self.dtype) for n in net.sizes] if net.dropout_p_hidden > 0 else None
        )
        self.matmuls = Matmuls(check_precision(precision, self.device, reference), self.dtype)
        # The fused CPU kernels also run the fast step's GRU cells (float32, tanh candidate).
        kernels = self.optimizer.kernels
        self._cell_kernels = (
            kernels if kernels is not None and net.hidden_act.name == "tanh" and self.matmuls.low is None else None
        )

    @property
    def uses_dropout(self) -> bool:
        """Whether a step draws dropout masks (from ``dropout_gen``)."""
        return self._embed_mask is not None or self._hidden_masks is not None

    def reset_hidden(self) -> None:
        for h in self.hidden:
            h.zero_()

    def _draw_mask(self, mask: Tensor | None, p: float) -> Tensor | None:
        """Draw a new dropout mask into ``mask`` (None: no dropout here)."""
        if mask is not None:
            # Inverted dropout: keep with probability 1 − p (u ≥ p), scale kept values by 1/(1 − p).
            # uniform + compare is ~5x faster than bernoulli_ on the CPU, and as graph-safe.
            torch.rand(mask.shape, generator=self.dropout_gen, out=mask)
            mask.ge_(p).mul_(1.0 / (1.0 - p))
        return mask

    def _dropout(self, x: Tensor, mask: Tensor | None, p: float) -> Tensor:
        return x if self._draw_mask(mask, p) is None else x * mask

    def train_step(self, inputs: Tensor, targets: Tensor, active: Tensor, keep: Tensor, samples: Tensor | None = None) -> Tensor:
        """One step over the B slots (one row of a :class:`~gru4rec.training.batching.Schedule`); returns
        the loss (0-dim device tensor, sum over active rows / B).

        ``active``: float 0/1 (B); ``keep``: float 0/1 (B×1), 0 where a slot starts a new session.
        An inactive slot does not exist (§3): it must carry items of an active slot (the schedule
        gives it the first active slot's), so that its zero gradient touches no other row.
        ``samples`` (S ids) default to the next row of the sample store.
        """
        if samples is None:
            samples = self.sampler.next() if self.sampler is not None else self._no_samples
        for h in self.hidden:
            h.mul_(keep)
        cols = torch.cat((targets, samples))
        col_valid = torch.cat((active, self._ones_s)) if self.n_sample > 0 else active
        n_cols = active.sum() + self.n_sample
        step = self._reference_step if self.reference else self._fast_step
        return step(inputs, targets, samples, cols, col_valid, active, n_cols)

    def _logq(self, targets: Tensor, samples: Tensor) -> Tensor | None:
        if self.logq_in is None:
            return None
        assert self.logq_sample is not None
        return torch.cat((self.logq_in.index_select(0, targets), self.logq_sample.index_select(0, samples)))

    def _sparse_grads(self, inputs: Tensor, cols: Tensor, g_in: Tensor, g_wy: Tensor, g_by: Tensor) -> dict[str, SparseGrad | list[SparseGrad]]:
        """Row indices and gradient rows of each item table (duplicates are summed by the optimiser)."""
        if self.net.mode == "shared":
            return {"Wy": [(inputs, g_in), (cols, g_wy)], "By": (cols, g_by)}
        return {"Wy": (cols, g_wy), "By": (cols, g_by), self.net.input_table_name: (inputs, g_in)}

    def _reference_step(self, inputs: Tensor, targets: Tensor, samples: Tensor, cols: Tensor, col_valid: Tensor, active: Tensor, n_cols: Tensor) -> Tensor:
        """The plain path: autograd through the model's forward and :func:`make_loss`."""
        net = self.net
        x_in = net.input_table.detach().index_select(0, inputs).requires_grad_()
        wy = net.Wy.detach().index_select(0, cols).requires_grad_()
        by = net.By.detach().index_select(0, cols).requires_grad_()
        with torch.enable_grad():
            x = self._dropout(x_in, self._embed_mask, net.dropout_p_embed)
            masks = self._hidden_masks
            dropout = None if masks is None else (lambda out, i: self._dropout(out, masks[i], net.dropout_p_hidden))
            new_hidden = net.run_layers(x, self.hidden, dropout)
            x = new_hidden[-1]
            raw = torch.addmm(by, x, wy.t())
            logq = self._logq(targets, samples)
            if logq is not None:
                raw = raw - logq
            loss = self.loss_fn(raw, col_valid, active, n_cols)
            grads = torch.autograd.grad(loss, [x_in, wy, by, *self._dense])
        self.optimizer.step(list(grads[3:]), self._sparse_grads(inputs, cols, grads[0], grads[1], grads[2]))
        for h, h_new in zip(self.hidden, new_hidden):
            h.copy_(h_new.detach())
        return loss.detach()

    @torch.no_grad()
    def _fast_step(self, inputs: Tensor, targets: Tensor, samples: Tensor, cols: Tensor, col_valid: Tensor, active: Tensor, n_cols: Tensor) -> Tensor:
        """The same step with the backward pass written out (no autograd): fewer, larger
        operations, gradients of the dense weights written straight into the optimiser's flat
        buffer. Must agree with :meth:`_reference_step` (tested). With ``precision='bfloat16'`` the
        matrix products take bfloat16 copies of their operands (see :class:`Matmuls`); everything
        else — the loss and its softmax, the GRU's gates, the optimiser — stays in float32."""
        net, opt, mm, cell = self.net, self.optimizer, self.matmuls, self._cell_kernels
        act = net.hidden_act
        x_rows = net.input_table.index_select(0, inputs)  # no_grad: plain tensors
        rows = self._score_rows(inputs, cols)
        wy = mm.cast(net.Wy.index_select(0, cols if rows is None else rows.uniq[: rows.n_scored]))
        bias = self._column_bias(targets, samples, cols, col_valid)

        # Forward, keeping what the backward pass needs (the products' operands as cast).
        x = x_rows if self._embed_mask is None else self._dropout(x_rows, self._embed_mask, net.dropout_p_embed)
        saved, outs = [], []
        for i, layer in enumerate(net.layers):
            h, n = self.hidden[i], layer.size
            projects = i > 0 or net.mode != "none"  # layer 0 in none mode adds its Wx_0 rows
            x_c = mm.cast(x)
            wx = mm.cast(layer.Wx) if projects else None
            v = mm.addmm(layer.Bh, x_c, wx) if wx is not None else x + layer.Bh
            h_c, wrz, wh = mm.cast(h), mm.cast(layer.Wrz), mm.cast(layer.Wh)
            mask = None if self._hidden_masks is None else self._hidden_masks[i]
            if cell is not None:  # the same operations, fused (cpu_kernels.c)
                rz = mm.addmm(v[:, n:], h_c, wrz)
                hr = cell.gru_gates(rz, h)
                c = mm.addmm(v[:, :n], hr, wh)
                x = cell.gru_output(c, h, rz, self._draw_mask(mask, net.dropout_p_hidden))
            else:
                rz = torch.sigmoid(mm.addmm(v[:, n:], h_c, wrz))
                hr = mm.cast(h * rz[:, :n])
                c = act(mm.addmm(v[:, :n], hr, wh))
                x = self._dropout(torch.lerp(h, c, rz[:, n:]), mask, net.dropout_p_hidden)
            saved.append((x_c, wx, h_c, wrz, hr, wh, rz, c))
            outs.append(x)
        x_c = mm.cast(x)
        if rows is None:
            scores = mm.addmm(bias, x_c, wy.t())
        else:  # one product row per distinct item, spread to the C columns
            scores = self._spread_columns(mm.mm(x_c, wy.t()), rows.col_rows, bias)
        loss, g_scores = self.loss_grad(scores, col_valid, active, n_cols)
        # dL/d(rows of wy): the columns of one item summed where rows are distinct items
        g_rows = g_scores if rows is None else self._merge_columns(g_scores, rows.col_rows, rows.n_scored)

        # Backward, one step deep (the carried hidden state is a constant).
        x_last = x_c
        d = mm.mm(mm.cast(g_rows), wy)  # dL/d(output of the last layer)
        grads = opt.grad_views
        for i in range(len(net.layers) - 1, -1, -1):
            layer, name = net.layers[i], f"layers.{i}"
            x_c, wx, h_c, wrz, hr, wh, rz, c = saved[i]
            h, n = self.hidden[i], layer.size
            mask = None if self._hidden_masks is None else self._hidden_masks[i]
            if cell is not None:  # the same operations, fused (cpu_kernels.c)
                d_v = cell.gru_backward_out(d, mask, rz, c, h)
                mm.mm_into(grads[f"{name}.Wh"], hr.t(), d_v[:, :n])
                cell.gru_backward_reset(mm.mm(d_v[:, :n], wh.t()), h, rz, d_v, grads[f"{name}.Bh"])
                mm.mm_into(grads[f"{name}.Wrz"], h_c.t(), d_v[:, n:])
            else:
                if mask is not None:
                    d = d * mask
                z = rz[:, n:]
                d_cand = d * z  # h_new = h + z·(c − h)
                f_prime = act.derivative(c)
                if f_prime is not None:
                    d_cand = d_cand * f_prime
                d_cand_c = mm.cast(d_cand)
                mm.mm_into(grads[f"{name}.Wh"], hr.t(), d_cand_c)
                d_r = mm.mm(d_cand_c, wh.t()) * h
                d_rz = torch.cat((d_r, d * (c - h)), dim=1) * (rz * (1.0 - rz))
                mm.mm_into(grads[f"{name}.Wrz"], h_c.t(), mm.cast(d_rz))
                d_v = torch.cat((d_cand, d_rz), dim=1)
                torch.sum(d_v, 0, out=grads[f"{name}.Bh"])
            if wx is None:
                d = d_v  # layer 0 in none mode: the gradient of the Wx_0 rows themselves
                break
            d_v_c = mm.cast(d_v)
            mm.mm_into(grads[f"{name}.Wx"], x_c.t(), d_v_c)
            d = mm.mm(d_v_c, wx.t())
        for h, out in zip(self.hidden, outs):
            h.copy_(out)
        g_in = d if self._embed_mask is None else d * self._embed_mask
        opt.step(opt.flat_grad, self._item_grads(inputs, cols, rows, g_rows, x_last, g_in))
        return loss

    def _column_bias(self, targets: Tensor, samples: Tensor, cols: Tensor, col_valid: Tensor) -> Tensor:
        """The score columns' bias: ``By[cols]`` minus logQ, and for the cross-entropy losses
        MASK where a column is not valid (masked columns leave the softmax through the bias)."""
        kernels = self.optimizer.kernels
        if kernels is not None:
            valid = col_valid if self._mask_in_bias else None
            return kernels.column_bias(cols, targets.shape[0], self.net.By, self.logq_in, self.logq_sample, valid)
        bias = self.net.By.index_select(0, cols)
        logq = self._logq(targets, samples)
        if logq is not None:
            bias = bias - logq
        if self._mask_in_bias:
            bias = bias + (1.0 - col_valid) * MASK
        return bias

    def _score_rows(self, inputs: Tensor, cols: Tensor) -> ScoreRows | None:
        """Which Wy rows the fast step's products use (None: the C columns themselves).

        Where the optimiser makes rows unique (CPU), the rows are the K ≤ C distinct items of the
        columns: the score, dL/dx and Wy-gradient products then take one row per distinct item
        instead of one per column (with 2,048 popularity samples of a small catalogue, K is a
        third below C). In shared mode the inputs' items, whose rows share the table, follow
        them. On a GPU finding distinct rows would sync, so there the rows are the C columns."""
        opt = self.optimizer
        if not opt.unique_rows:
            return None
        n_cols = cols.shape[0]
        if self.net.mode != "shared":
            uniq, inverse, k = opt.unique(cols)
            return ScoreRows(uniq, k, inverse, None)
        uniq, inverse, k = opt.unique(torch.cat((cols, inputs)), n_first=n_cols)
        return ScoreRows(uniq, k, inverse[:n_cols], inverse[n_cols:])

    def _spread_columns(self, s: Tensor, col_rows: Tensor, bias: Tensor) -> Tensor:
        """The B×C scores from the B×K scores of the distinct rows: ``s[:, col_rows] + bias``."""
        kernels = self.optimizer.kernels
        if kernels is not None:
            return kernels.gather_columns(s, col_rows, bias)
        return s.index_select(1, col_rows).add_(bias)

    def _merge_columns(self, g: Tensor, col_rows: Tensor, n_rows: int) -> Tensor:
        """The B×K gradient of the distinct rows' scores: the B×C columns summed by row."""
        kernels = self.optimizer.kernels
        if kernels is not None:
            return kernels.sum_columns(g, col_rows, n_rows)
        return g.new_zeros((g.shape[0], n_rows)).index_add_(1, col_rows, g)

    def _item_grads(self, inputs: Tensor, cols: Tensor, rows: ScoreRows | None, g_rows: Tensor, x_c: Tensor,
                    g_in: Tensor) -> dict[str, UniqueGrad | SparseGrad | list[SparseGrad]]:
        """The item tables' gradient rows of the fast step, from dL/d(scores of the rows of
        :meth:`_score_rows`) ``g_rows`` (B×C, or B×K for distinct rows), the last layer's output
        ``x_c`` (as cast for the products) and the input rows' gradient ``g_in``. With distinct
        rows, one product gives each Wy row's gradient exactly once."""
        mm = self.matmuls
        g_by = g_rows.sum(0)
        if rows is None:
            return self._sparse_grads(inputs, cols, g_in, mm.mm(mm.cast(g_rows).t(), x_c), g_by)
        scored = rows.uniq[: rows.n_scored]
        if rows.input_rows is None:
            g_wy = mm.mm(mm.cast(g_rows).t(), x_c)
            return {"Wy": UniqueGrad(scored, g_wy), "By": UniqueGrad(scored, g_by), self.net.input_table_name: (inputs, g_in)}
        # shared: the scored rows' gradient, then the input rows' (items that are only inputs
        # follow the scored ones and keep their bias, and the bias's momentum, untouched)
        g_wy = g_in.new_empty((rows.uniq.shape[0], x_c.shape[1]))
        mm.mm_into(g_wy[: rows.n_scored], mm.cast(g_rows).t(), x_c)
        g_wy[rows.n_scored:].zero_()
        self.optimizer.add_rows(g_wy, rows.input_rows, g_in)
        return {"Wy": UniqueGrad(rows.uniq, g_wy), "By": UniqueGrad(scored, g_by)}

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, object]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict() if self.sampler is not None else {},
            "dropout_gen": self.dropout_gen.get_state(),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])  # type: ignore[arg-type]
        self.dropout_gen.set_state(state["dropout_gen"])  # type: ignore[arg-type]


@dataclass
class EpochStats:
    """What one epoch measured."""

    epoch: int
    loss: float
    seconds: float
    n_steps: int
    n_events: int

    @property
    def mb_per_s(self) -> float:
        return self.n_steps / self.seconds if self.seconds > 0 else math.inf

    @property
    def events_per_s(self) -> float:
        return self.n_events / self.seconds if self.seconds > 0 else math.inf

    def line(self) -> str:
        """The original's per-epoch line."""
        return (
            f"Epoch{self.epoch} --> loss: {self.loss:.6f} \t({self.seconds:.2f}s) "
            f"\t[{self.mb_per_s:.2f} mb/s | {self.events_per_s:.0f} e/s]"
        )


class _Progress:
    """A one-line progress bar on a terminal; silent otherwise. Updates at most every 0.5 s."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label = total, label
        self.enabled = enabled and sys.stderr.isatty()
        self.start = self.last = time.perf_counter()

    def due(self) -> bool:
        now = time.perf_counter()
        if now - self.last < 0.5:
            return False
        self.last = now
        return True

    def show(self, done: int, loss: float) -> None:
        if not self.enabled:
            return
        rate = done / max(time.perf_counter() - self.start, 1e-9)
        width = 30
        filled = int(width * done / max(self.total, 1))
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} loss {loss:.4f} {rate:.0f} mb/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


def reorder(items: np.ndarray, offsets: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Items and offsets with the sessions rearranged in ``order`` (vectorised)."""
    lengths = np.diff(offsets)[order]
    new_offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    take = np.repeat(offsets[:-1][order] - new_offsets[:-1], lengths) + np.arange(new_offsets[-1])
    return items[take], new_offsets


def train_epochs(
    trainer: Trainer,
    items: np.ndarray,
    offsets: np.ndarray,
    *,
    first_epoch: int = 1,
    n_epochs: int | None = None,
    rng: np.random.Generator | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = print,
) -> Iterator[EpochStats]:
    """Train epoch after epoch, yielding each epoch's statistics (the caller may stop early).

    Raises :class:`TrainingDivergedError` when the loss becomes NaN or infinite.
    """
    config = trainer.config
    last = config.n_epochs if n_epochs is None else n_epochs
    rng = rng if rng is not None else np.random.default_rng(config.seed + 3)
    schedule: Schedule | None = None
    for epoch in range(first_epoch, last + 1):
        if schedule is None or config.train_random_order:
            if config.train_random_order:
                ep_items, ep_offsets = reorder(items, offsets, rng.permutation(len(offsets) - 1))
            else:
                ep_items, ep_offsets = items, offsets
            schedule = build_schedule(ep_items, ep_offsets, config.batch_size, config.n_sample, trainer.device, trainer.dtype)
        if schedule.n_steps == 0:
            raise TrainingDivergedError("the training data has no session of length 2 or more: nothing to train on")
        trainer.net.train()
        trainer.reset_hidden()
        stats = _run_epoch(trainer, schedule, epoch, progress)
        if log is not None:
            log(stats.line())
        yield stats


def _run_epoch(trainer: Trainer, schedule: Schedule, epoch: int, progress: bool) -> EpochStats:
    device = trainer.device
    weights = torch.as_tensor(schedule.n_active, device=device, dtype=torch.float64)
    step_ids = torch.arange(schedule.n_steps, device=device)
    step_losses = torch.zeros(schedule.n_steps, device=device, dtype=torch.float64)
    bar = _Progress(schedule.n_steps, f"Epoch{epoch}", progress)

    def accumulate(loss: Tensor, t: Tensor) -> None:
        """Device-side bookkeeping of step ``t``: its loss goes into the epoch's loss vector."""
        step_losses.index_copy_(0, t.view(1), loss.view(1).to(torch.float64))

    def check(done: int) -> float:
        """The epoch loss so far — the mean of the step losses weighted by their active rows —
        and the NaN check (one host sync)."""
        losses = step_losses[:done]
        bad = ~torch.isfinite(losses)
        if bool(bad.any()):
            first = int(bad.nonzero()[0, 0])
            raise TrainingDivergedError(
                f"the loss became NaN or infinite in epoch {epoch} at step {first + 1} of {schedule.n_steps}; "
                "lower learning_rate or momentum (or set grad_cap)"
            )
        return float((losses * weights[:done]).sum()) / max(float(schedule.n_active[:done].sum()), 1.0)

    run = graphed_epoch_runner(trainer, schedule, accumulate) if cuda_graphs_enabled(device) and not trainer.reference else None
    if run is None:
        inputs, targets, active, keep = schedule.inputs, schedule.targets, schedule.active, schedule.keep

        def run(t: int) -> None:
            accumulate(trainer.train_step(inputs[t], targets[t], active[t], keep[t]), step_ids[t])

    start = time.perf_counter()
    for t in range(schedule.n_steps):
        run(t)
        if bar.due():  # also bounds how long a diverged run goes on unnoticed
            bar.show(t + 1, check(t + 1))
    mean_loss = check(schedule.n_steps)
    seconds = time.perf_counter() - start
    bar.close()
    return EpochStats(epoch=epoch, loss=mean_loss, seconds=seconds, n_steps=schedule.n_steps, n_events=schedule.n_events)
