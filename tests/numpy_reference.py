"""Independent NumPy (float64) reference of one GRU4Rec training step, written from the documented behaviour alone
(docs/behaviour.md), not from the package's code.

This module is a test helper, not part of the package. It re-states docs/behaviour.md §2–§6 in plain NumPy so
that the torch engine can be compared with something that shares none of its code:

* :func:`forward_step` — hidden reset, the Cho-form GRU over any number of layers in the three
  embedding modes (§2), compaction to the active rows (shrinking semantics, §3), candidate
  columns ``[targets of the active rows, shared samples]`` (§4), logQ, ``final_act`` and every
  loss of §5 (smoothing, bpreg), summed over the active rows and divided by the *configured*
  batch size.
* :func:`numerical_gradients` — central finite differences of that float64 loss, so the
  reference needs no hand-derived backward pass.
* :func:`sparse_rows` / :func:`optimizer_step` — the optimisers of §6 with lazy sparse rows
  (one update per unique used row, on the row-summed gradient), dense updates elsewhere,
  ``grad_cap`` on the global norm, ``lmbd``, classical momentum.
* :func:`reference_schedule` — a plain Python simulation of the session-parallel schedule (§3).
* :func:`sample_probabilities` — the ``supp ** alpha`` distribution of the negative sampler (§4).

Parameters are a flat ``dict[str, np.ndarray]``: ``Wy`` (N×L), ``By`` (N), ``E`` (N×K, separate
mode only) and per layer ``i``: ``Wx_i`` (d_i×3L_i), ``Wh_i`` (L_i×L_i), ``Wrz_i`` (L_i×2L_i),
``Bh_i`` (3L_i).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

Params = dict[str, np.ndarray]
EPS_LOG = 1e-24


# ----------------------------------------------------------------------------------------------
# Activations (§2)
# ----------------------------------------------------------------------------------------------
def _split_act(spec: str) -> tuple[str, list[float]]:
    name, _, rest = spec.strip().lower().partition("-")
    if not rest:
        return name, []
    if name == "selu":
        # 'selu-S-A': split on the first '-' that is not part of an exponent.
        for k in range(1, len(rest)):
            if rest[k] == "-" and rest[k - 1] not in "eE":
                return name, [float(rest[:k]), float(rest[k + 1:])]
        raise ValueError(spec)
    return name, [float(rest)]


def elementwise_act(spec: str, x: np.ndarray) -> np.ndarray:
    """Apply an elementwise activation string (``tanh``, ``elu-0.5``, ``selu-S-A``, ...)."""
    name, p = _split_act(spec)
    if name == "linear":
        return x
    if name == "tanh":
        return np.tanh(x)
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "leaky":
        return np.where(x >= 0, x, p[0] * x)
    if name == "elu":
        return np.where(x >= 0, x, p[0] * (np.exp(np.minimum(x, 0.0)) - 1.0))
    if name == "selu":
        return p[0] * np.where(x >= 0, x, p[1] * (np.exp(np.minimum(x, 0.0)) - 1.0))
    raise ValueError(f"not an elementwise activation: {spec!r}")


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function (float64, stable for large |x|)."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise softmax."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax."""
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


# ----------------------------------------------------------------------------------------------
# Configuration of one reference step
# ----------------------------------------------------------------------------------------------
@dataclass
class RefConfig:
    """The hyperparameters one reference step needs (names as in docs/behaviour.md §7)."""

    layers: Sequence[int] = (4,)
    mode: str = "shared"  # 'none' | 'separate' | 'shared'
    loss: str = "cross-entropy"
    final_act: str = "softmax"
    hidden_act: str = "tanh"
    batch_size: int = 4
    logq: float = 0.0
    sample_alpha: float = 0.5
    smoothing: float = 0.0
    bpreg: float = 1.0


def init_params(n_items: int, layers: Sequence[int], mode: str, embedding: int = 0,
                rng: np.random.Generator | None = None, scale: float = 0.5,
                bias_scale: float = 0.1) -> Params:
    """Random float64 parameters with the shapes of §2 (non-zero biases, so bias bugs show)."""
    rng = rng or np.random.default_rng(0)
    p: Params = {}
    last = layers[-1]
    p["Wy"] = rng.uniform(-scale, scale, (n_items, last))
    p["By"] = rng.uniform(-bias_scale, bias_scale, n_items)
    if mode == "separate":
        p["E"] = rng.uniform(-scale, scale, (n_items, embedding))
        d0 = embedding
    elif mode == "none":
        d0 = n_items
    elif mode == "shared":
        d0 = last
    else:
        raise ValueError(mode)
    d = d0
    for i, size in enumerate(layers):
        p[f"Wx_{i}"] = rng.uniform(-scale, scale, (d, 3 * size))
        p[f"Wh_{i}"] = rng.uniform(-scale, scale, (size, size))
        p[f"Wrz_{i}"] = rng.uniform(-scale, scale, (size, 2 * size))
        p[f"Bh_{i}"] = rng.uniform(-bias_scale, bias_scale, 3 * size)
        d = size
    return p


# ----------------------------------------------------------------------------------------------
# Forward (§2) and loss (§4, §5)
# ----------------------------------------------------------------------------------------------
def gru_layer(x: np.ndarray | None, h: np.ndarray, Wx: np.ndarray, Wh: np.ndarray,
              Wrz: np.ndarray, Bh: np.ndarray, hidden_act: str,
              onehot_rows: np.ndarray | None = None) -> np.ndarray:
    """One Cho-form GRU step; with ``onehot_rows`` the input is the one-hot product ``Wx[rows]``."""
    L = h.shape[1]
    v = (Wx[onehot_rows] if onehot_rows is not None else x @ Wx) + Bh
    r = sigmoid(v[:, L:2 * L] + h @ Wrz[:, :L])
    z = sigmoid(v[:, 2 * L:3 * L] + h @ Wrz[:, L:])
    cand = elementwise_act(hidden_act, (h * r) @ Wh + v[:, :L])
    return (1.0 - z) * h + z * cand


def gru_forward(params: Params, hidden: Sequence[np.ndarray], items: np.ndarray,
                cfg: RefConfig) -> tuple[np.ndarray, list[np.ndarray]]:
    """Run every layer on ``items`` from states ``hidden`` (already reset); return (out, new states)."""
    new_h: list[np.ndarray] = []
    if cfg.mode == "none":
        x = None
    elif cfg.mode == "separate":
        x = params["E"][items]
    else:
        x = params["Wy"][items]
    for i in range(len(cfg.layers)):
        rows = items if (i == 0 and cfg.mode == "none") else None
        h = gru_layer(x, hidden[i], params[f"Wx_{i}"], params[f"Wh_{i}"], params[f"Wrz_{i}"],
                      params[f"Bh_{i}"], cfg.hidden_act, onehot_rows=rows)
        new_h.append(h)
        x = h
    return x, new_h


def apply_final_act(spec: str, s: np.ndarray) -> np.ndarray:
    """``final_act`` on a score matrix (softmaxes are row-wise)."""
    name = spec.strip().lower()
    if name == "softmax":
        return softmax(s)
    if name == "softmax_logit":
        return -log_softmax(s)
    return elementwise_act(spec, s)


def loss_per_row(loss: str, r: np.ndarray, smoothing: float = 0.0, bpreg: float = 1.0) -> np.ndarray:
    """Per-row loss of §5 on the activated score matrix ``r`` (M × n, positive of row i at column i)."""
    M, n = r.shape
    idx = np.arange(M)
    pos = r[idx, idx]
    if loss == "cross-entropy":
        nll = -np.log(r + EPS_LOG)
        if smoothing > 0:
            return (1 - smoothing * n / (n - 1)) * nll[idx, idx] + smoothing / (n - 1) * nll.sum(1)
        return nll[idx, idx]
    if loss == "xe_logit":
        if smoothing > 0:
            return (1 - smoothing * n / (n - 1)) * pos + smoothing / (n - 1) * r.sum(1)
        return pos
    if loss in ("bpr-max", "top1-max"):
        negmask = ~np.eye(M, n, dtype=bool)
        masked = np.where(negmask, r, -np.inf)
        e = np.exp(masked - masked.max(axis=1, keepdims=True))
        s = e / e.sum(axis=1, keepdims=True)  # softmax over the negatives; positive weight 0
        if loss == "bpr-max":
            return (-np.log((s * sigmoid(pos[:, None] - r)).sum(1) + EPS_LOG)
                    + bpreg * (s * r ** 2).sum(1))
        return (s * (sigmoid(r - pos[:, None]) + sigmoid(r ** 2))).sum(1)
    if loss == "bpr":
        return -np.log(sigmoid(pos[:, None] - r) + EPS_LOG).sum(1)
    if loss == "top1":
        return (sigmoid(r - pos[:, None]) + sigmoid(r ** 2)).mean(1) - sigmoid(pos ** 2) / n
    raise ValueError(loss)


@dataclass
class StepResult:
    """Everything one reference step computes (active rows only, in slot order)."""

    loss: float
    active_idx: np.ndarray      # slot indices of the active rows (the M compacted rows)
    cols: np.ndarray            # candidate columns, M + S
    out: np.ndarray             # M × L output of the last layer
    hidden: list[np.ndarray]    # per layer, M × L_i new states of the active rows
    scores: np.ndarray          # M × (M+S) raw scores h·Wy[cols]ᵀ + By[cols]
    scores_logq: np.ndarray     # after the logQ correction, before final_act
    r: np.ndarray               # after final_act
    row_loss: np.ndarray        # M per-row losses (not divided)


def forward_step(params: Params, hidden: Sequence[np.ndarray], inp: np.ndarray, tgt: np.ndarray,
                 active: np.ndarray, reset: np.ndarray, samples: np.ndarray, cfg: RefConfig,
                 item_support: np.ndarray | None = None) -> StepResult:
    """One training step's forward pass and loss, in shrinking semantics.

    ``hidden`` holds the B-row states before the step; rows with ``reset`` start from zero;
    only ``active`` rows exist (they are compacted, in slot order).
    """
    act_idx = np.flatnonzero(np.asarray(active, dtype=bool))
    reset = np.asarray(reset, dtype=bool)
    h0 = [np.where(reset[act_idx, None], 0.0, np.asarray(h, dtype=np.float64)[act_idx]) for h in hidden]
    items = np.asarray(inp)[act_idx]
    out, new_h = gru_forward(params, h0, items, cfg)
    M = len(act_idx)
    cols = np.concatenate([np.asarray(tgt)[act_idx], np.asarray(samples)]).astype(np.int64)
    scores = out @ params["Wy"][cols].T + params["By"][cols]
    s = scores
    if cfg.logq > 0:
        assert item_support is not None
        logs = np.log(np.asarray(item_support, dtype=np.float64)[cols])
        corr = np.concatenate([cfg.logq * logs[:M], cfg.logq * cfg.sample_alpha * logs[M:]])
        s = scores - corr[None, :]
    r = apply_final_act(cfg.final_act, s)
    rl = loss_per_row(cfg.loss, r, cfg.smoothing, cfg.bpreg)
    return StepResult(float(rl.sum() / cfg.batch_size), act_idx, cols, out, new_h, scores, s, r, rl)


# ----------------------------------------------------------------------------------------------
# Gradients by finite differences
# ----------------------------------------------------------------------------------------------
def numerical_gradients(fn: Callable[[Params], float], params: Params, eps: float = 1e-4,
                        rows: dict[str, np.ndarray] | None = None) -> Params:
    """Central (five-point) finite differences of ``fn`` w.r.t. every entry of every parameter.

    ``rows`` optionally restricts a parameter to the given first-axis rows (the others are
    known to have zero gradient because the step never reads them); their gradient is 0.
    """
    grads: Params = {}
    for name, p in params.items():
        g = np.zeros_like(p)
        if rows is not None and name in rows:
            entries = [(r,) + tuple(rest) for r in np.unique(rows[name])
                       for rest in np.ndindex(*p.shape[1:])]
        else:
            entries = list(np.ndindex(*p.shape))
        for ix in entries:
            old = p[ix]
            f = []
            for k in (1, -1, 2, -2):
                p[ix] = old + k * eps
                f.append(fn(params))
            p[ix] = old
            # five-point stencil: truncation error O(eps**4), rounding error ~1e-16/eps
            g[ix] = (8 * (f[0] - f[1]) - (f[2] - f[3])) / (12 * eps)
        grads[name] = g
    return grads


def sparse_rows(cfg: RefConfig, inp: np.ndarray, active: np.ndarray, cols: np.ndarray) -> dict[str, np.ndarray]:
    """Unique rows each sparse parameter uses in a step (§6): input items of active rows, columns."""
    items = np.asarray(inp)[np.asarray(active, dtype=bool)]
    cols = np.asarray(cols)
    rows = {"By": np.unique(cols)}
    if cfg.mode == "shared":
        rows["Wy"] = np.unique(np.concatenate([items, cols]))
    else:
        rows["Wy"] = np.unique(cols)
    if cfg.mode == "separate":
        rows["E"] = np.unique(items)
    if cfg.mode == "none":
        rows["Wx_0"] = np.unique(items)
    return rows


def step_gradients(params: Params, hidden: Sequence[np.ndarray], inp: np.ndarray, tgt: np.ndarray,
                   active: np.ndarray, reset: np.ndarray, samples: np.ndarray, cfg: RefConfig,
                   item_support: np.ndarray | None = None, eps: float = 1e-4) -> tuple[StepResult, Params, dict[str, np.ndarray]]:
    """Forward result, finite-difference gradients and used sparse rows of one step."""
    res = forward_step(params, hidden, inp, tgt, active, reset, samples, cfg, item_support)
    rows = sparse_rows(cfg, inp, active, res.cols)

    def fn(p: Params) -> float:
        return forward_step(p, hidden, inp, tgt, active, reset, samples, cfg, item_support).loss

    grads = numerical_gradients(fn, params, eps, rows)
    return res, grads, rows


# ----------------------------------------------------------------------------------------------
# Optimisers (§6)
# ----------------------------------------------------------------------------------------------
@dataclass
class OptConfig:
    """Optimiser hyperparameters (names as in docs/behaviour.md §7)."""

    adapt: str = "adagrad"
    learning_rate: float = 0.05
    momentum: float = 0.0
    lmbd: float = 0.0
    grad_cap: float = 0.0
    adapt_params: Sequence[float] = ()
    eps: float = 1e-6        # adagrad / rmsprop / adadelta epsilon (inside the root)
    adam_eps: float = 1e-8   # adam epsilon (outside the root, as in Kingma & Ba)


@dataclass
class OptState:
    """Full-size optimiser state per parameter (lazy rows are read/written only when used)."""

    acc: Params = field(default_factory=dict)    # adagrad/rmsprop/adadelta sum, adam second moment
    acc2: Params = field(default_factory=dict)   # adadelta update accumulator, adam first moment
    vel: Params = field(default_factory=dict)    # momentum velocity
    t: int = 0                                   # steps taken (adam bias correction)

    @staticmethod
    def zeros(params: Params) -> OptState:
        """Fresh zero state for ``params``."""
        z = lambda: {k: np.zeros_like(v) for k, v in params.items()}  # noqa: E731
        return OptState(z(), z(), z(), 0)

    def copy(self) -> OptState:
        """Deep copy."""
        c = lambda d: {k: v.copy() for k, v in d.items()}  # noqa: E731
        return OptState(c(self.acc), c(self.acc2), c(self.vel), self.t)


def optimizer_step(params: Params, grads: Params, state: OptState, rows: dict[str, np.ndarray],
                   opt: OptConfig) -> tuple[Params, OptState]:
    """Apply one update of §6; returns new (params, state), the inputs are not modified.

    ``rows[name]`` lists the unique used rows of a sparse parameter: only they are updated and
    only their state is read/written. ``grads`` are full-size (the finite-difference gradient of
    a row already is the sum of the contributions of its duplicate uses).
    """
    params = {k: v.copy() for k, v in params.items()}
    state = state.copy()
    state.t += 1
    if opt.grad_cap > 0:
        # Global norm over dense gradients and the used (summed) sparse rows: unused rows are 0.
        norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
        if norm > opt.grad_cap:
            grads = {k: g * (opt.grad_cap / norm) for k, g in grads.items()}
    lr = 1.0 if opt.adapt == "adadelta" else opt.learning_rate
    ap = list(opt.adapt_params)
    for name, p in params.items():
        sel = rows[name] if name in rows else slice(None)
        g = grads[name][sel]
        if opt.adapt == "adagrad":
            acc = state.acc[name][sel] + g ** 2
            state.acc[name][sel] = acc
            gh = g / np.sqrt(acc + opt.eps)
        elif opt.adapt == "rmsprop":
            rho = ap[0]
            acc = rho * state.acc[name][sel] + (1 - rho) * g ** 2
            state.acc[name][sel] = acc
            gh = g / np.sqrt(acc + opt.eps)
        elif opt.adapt == "adadelta":
            rho = ap[0]
            acc = rho * state.acc[name][sel] + (1 - rho) * g ** 2
            state.acc[name][sel] = acc
            gh = g * np.sqrt(state.acc2[name][sel] + opt.eps) / np.sqrt(acc + opt.eps)
            state.acc2[name][sel] = rho * state.acc2[name][sel] + (1 - rho) * gh ** 2
        elif opt.adapt == "adam":
            b1, b2 = ap[0], ap[1]
            m = b1 * state.acc2[name][sel] + (1 - b1) * g
            v = b2 * state.acc[name][sel] + (1 - b2) * g ** 2
            state.acc2[name][sel] = m
            state.acc[name][sel] = v
            mh = m / (1 - b1 ** state.t)
            vh = v / (1 - b2 ** state.t)
            gh = mh / (np.sqrt(vh) + opt.adam_eps)
        elif opt.adapt == "sgd":
            gh = g
        else:
            raise ValueError(opt.adapt)
        if opt.momentum > 0:
            vel = opt.momentum * state.vel[name][sel] - lr * (gh + opt.lmbd * p[sel])
            state.vel[name][sel] = vel
            p[sel] = p[sel] + vel
        else:
            p[sel] = p[sel] * (1 - lr * opt.lmbd) - lr * gh
    return params, state


# ----------------------------------------------------------------------------------------------
# Session-parallel schedule (§3)
# ----------------------------------------------------------------------------------------------
def reference_schedule(offsets: Sequence[int], batch_size: int, n_sample: int) -> list[list[tuple[int, int, int, bool]]]:
    """Simulate §3 slot by slot; per step the list of ``(slot, input, target, reset)`` of active slots.

    ``input``/``target`` are event indices (target = input + 1); ``reset`` is True on the first
    step of a session in its slot. Sessions shorter than 2 never appear. When several slots
    finish at the same step, the lower slot takes the next session first.
    """
    offsets = [int(o) for o in offsets]
    n_sess = len(offsets) - 1
    nxt = 0

    def take() -> tuple[int, int] | None:
        nonlocal nxt
        while nxt < n_sess:
            s = nxt
            nxt += 1
            if offsets[s + 1] - offsets[s] >= 2:
                return offsets[s], offsets[s + 1]
        return None

    cur: list[list[int] | None] = []
    for _ in range(batch_size):
        se = take()
        cur.append([se[0], se[1], 1] if se else None)  # [pos, end, reset]
    steps: list[list[tuple[int, int, int, bool]]] = []
    while True:
        active = [b for b in range(batch_size) if cur[b] is not None]
        if not active or (len(active) < 2 and n_sample == 0):
            break
        steps.append([(b, cur[b][0], cur[b][0] + 1, bool(cur[b][2])) for b in active])
        for b in active:
            c = cur[b]
            c[0] += 1
            c[2] = 0
            if c[0] + 1 >= c[1]:
                se = take()
                cur[b] = [se[0], se[1], 1] if se else None
    return steps


# ----------------------------------------------------------------------------------------------
# Sampling (§4)
# ----------------------------------------------------------------------------------------------
def sample_probabilities(item_support: np.ndarray, alpha: float) -> np.ndarray:
    """The distribution the extra negatives are drawn from: ``supp ** alpha`` normalised."""
    w = np.asarray(item_support, dtype=np.float64) ** alpha
    return w / w.sum()
