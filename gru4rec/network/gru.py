"""The GRU4Rec network (docs/behaviour.md §2): item tables, a hand-written GRU cell in the Cho form, scoring.

``torch.nn.GRU`` applies the reset gate after the recurrent product and carries two biases, which
is a different model; the cell here is written out as in the original:

    v      = x·Wx + Bh                               (one-hot mode, layer 0: v = Wx_0[item] + Bh)
    r, z   = sigmoid(v_r + h·Wrz_r), sigmoid(v_z + h·Wrz_z)
    h_cand = hidden_act((h ⊙ r)·Wh + v_c)             (reset applied BEFORE the product)
    h_new  = (1 − z) ⊙ h + z ⊙ h_cand

Column blocks: ``Wx`` and ``Bh`` are [candidate | reset | update], ``Wrz`` is [reset | update].

The reference training step (:mod:`gru4rec.training.reference`) calls the functional pieces below
on gathered item rows so that only the rows a step touches take part (the fast step,
:mod:`gru4rec.training.step`, writes the same cell out with its derivative); ``step``/``score_all``
serve prediction and evaluation.

With item attributes (issue 49, docs/attributes.md) the network holds a
:class:`~gru4rec.items.rows.ComposedRows` over ``Wy`` and ``By`` (``attributes``, with a bias
column): every row of ``Wy`` it reads — scores, and in shared mode the input rows — is then the
composed row (id row plus the item's attribute embeddings), every bias the id bias plus the
attributes' bias part, and the scores cover the cold items too (:attr:`GRU4RecNet.n_catalogue`).
In the separate and one-hot modes a second composition (``input_attributes``, its own attribute
tables, no bias) composes the rows of ``E`` or ``Wx_0`` that feed layer 0 alike, so in every mode
a clicked item — a cold one too — feeds layer 0 its id row (none for a cold item) plus its
attributes' input embeddings. In training, ``dropout_p_id`` drops the id part of a share of the
step's items (:attr:`dropout_p_id`).
Without attributes ``attributes`` is None and every path is the plain one, bit for bit.

With click context (``config.click_context``, docs/attributes.md) layer 0's projection adds each
input click's five context features (:mod:`gru4rec.items.context`) through ``Wc`` (5×3L₀, a
dense parameter drawn after every other one): ``v = x·Wx + ctx·Wc + Bh`` (one-hot mode:
``Wx_0[item] + ctx·Wc + Bh``). Without it ``Wc`` is None and no path changes.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from gru4rec.config import Config
from gru4rec.config.activations import Activation
from gru4rec.items.attributes import ItemAttributes
from gru4rec.items.context import N_CONTEXT
from gru4rec.items.rows import ComposedCatalogue, ComposedRows

__all__ = ["GRU4RecNet", "GRULayer", "gru_cell"]

Act = Callable[[Tensor], Tensor]


def gru_cell(v: Tensor, h: Tensor, Wh: Tensor, Wrz: Tensor, act: Act) -> Tensor:
    """One GRU step given the input projection ``v = x·Wx + Bh`` (B×3L) and the state ``h`` (B×L)."""
    n = h.shape[1]
    rz = torch.sigmoid(torch.addmm(v[:, n:], h, Wrz))
    r, z = rz[:, :n], rz[:, n:]
    h_cand = act(torch.addmm(v[:, :n], h * r, Wh))
    return torch.lerp(h, h_cand, z)  # (1 − z)·h + z·h_cand


def _fill(block: Tensor, sigma: float, normal: bool, generator: torch.Generator | None) -> None:
    """Draw ``block`` in place by the rule of every weight block (docs/behaviour.md §2):
    U[−σ, σ] with σ = sqrt(6/(rows+cols)) unless ``sigma > 0`` fixes it; N(0, σ²) when ``normal``."""
    s = sigma if sigma > 0 else math.sqrt(6.0 / (block.shape[0] + block.shape[1]))
    values = torch.empty(block.shape, dtype=block.dtype)
    if normal:
        values.normal_(0.0, s, generator=generator)
    else:
        values.uniform_(-s, s, generator=generator)
    block.copy_(values)


class GRULayer(nn.Module):
    """Parameters of one GRU layer: ``Wx`` (d×3L), ``Wh`` (L×L), ``Wrz`` (L×2L), ``Bh`` (3L)."""

    def __init__(self, in_dim: int, size: int) -> None:
        super().__init__()
        self.size = size
        self.Wx = nn.Parameter(torch.empty(in_dim, 3 * size))
        self.Wh = nn.Parameter(torch.empty(size, size))
        self.Wrz = nn.Parameter(torch.empty(size, 2 * size))
        self.Bh = nn.Parameter(torch.zeros(3 * size))


class GRU4RecNet(nn.Module):
    """Item tables and GRU layers of GRU4Rec.

    Parameters: ``Wy`` (N×L output items), ``By`` (N), ``E`` (N×K, separate-embedding mode only,
    else ``None``) and ``layers[i]`` (:class:`GRULayer`). The input to layer 0 is, by
    ``config.embedding_mode``: ``Wy[item]`` (shared), ``E[item]`` (separate) or the row
    ``Wx_0[item]`` itself (none: the one-hot product).

    ``attributes`` (item attributes encoded on the model's ``n_items`` items, cold items after
    them): ``Wy``'s rows and ``By``'s biases become composed ones (``self.attributes``, a
    :class:`~gru4rec.items.rows.ComposedRows` of width L with a bias column, drawn after every
    other table with ``generator``); in the separate and one-hot modes the input rows too
    (``self.input_attributes``: width ``embedding`` over ``E``, or 3L₀ over ``Wx_0``, no bias,
    drawn next, each block with the σ of the table it adds to). Attributes without any column
    change nothing: both are None.
    """

    def __init__(self, n_items: int, config: Config, *, generator: torch.Generator | None = None,
                 attributes: ItemAttributes | None = None) -> None:
        super().__init__()
        if n_items < 1:
            raise ValueError("GRU4RecNet needs at least one item")
        self.n_items = n_items
        self.mode = config.embedding_mode
        self.hidden_act: Activation = config.hidden_activation
        self.dropout_p_embed = config.dropout_p_embed if self.mode != "none" else 0.0
        self.dropout_p_hidden = config.dropout_p_hidden
        sizes = list(config.layers)
        self.Wy = nn.Parameter(torch.empty(n_items, sizes[-1]))
        self.By = nn.Parameter(torch.zeros(n_items))
        if self.mode == "separate":
            self.E: nn.Parameter | None = nn.Parameter(torch.empty(n_items, int(config.embedding)))
            in_dim = int(config.embedding)
        else:
            self.E = None
            in_dim = sizes[-1] if self.mode == "shared" else n_items
        layers = []
        for size in sizes:
            layers.append(GRULayer(in_dim, size))
            in_dim = size
        # A ModuleList registers the layers' parameters; torch types its items as plain Modules.
        self.layers: Sequence[GRULayer] = nn.ModuleList(layers)  # type: ignore[assignment]  # its items are GRULayers
        self.reset_parameters(config.sigma, config.init_as_normal, generator)
        #: The attribute side of Wy's rows, or None: plain item rows (the plain code paths).
        self.attributes: ComposedRows | None = None
        #: The attribute side of the input table's rows in the separate and one-hot modes (``E``,
        #: ``Wx_0``); None in shared mode (the input rows are Wy's, composed by ``attributes``)
        #: and without attributes. See :attr:`input_composition`.
        self.input_attributes: ComposedRows | None = None
        if attributes is not None:
            if attributes.n_warm != n_items:
                raise ValueError(f"GRU4RecNet: the attributes are for {attributes.n_warm} items, the network has {n_items}")
            # Built with a throwaway generator, then drawn by the config's rule from ``generator``.
            rows = ComposedRows(attributes, sizes[-1], bias=True, generator=torch.Generator())
            if rows.has_attributes:
                rows.reset_parameters(config.sigma, config.init_as_normal, generator, n_rows=n_items)
                self.attributes = rows
                if self.mode != "shared":
                    # E's width, or Wx_0's 3L₀ columns, whose blocks are each drawn with the σ of an
                    # N × L₀ block (reset_parameters): the input parts start on the id rows' scale.
                    width = int(config.embedding) if self.mode == "separate" else 3 * sizes[0]
                    block = width if self.mode == "separate" else sizes[0]
                    inputs = ComposedRows(attributes, width, generator=torch.Generator())
                    inputs.reset_parameters(config.sigma if config.sigma > 0 else math.sqrt(6.0 / (n_items + block)),
                                            config.init_as_normal, generator)
                    self.input_attributes = inputs
        #: The probability that a training step drops an item's id part (its id row and id
        #: bias: the item is composed from its attributes alone, as a cold item is), so that the
        #: attribute parts learn to score an item on their own; 0 without attributes.
        self.dropout_p_id = config.dropout_p_id if self.attributes is not None else 0.0
        #: Layer 0's context projection (N_CONTEXT × 3L₀; ``config.click_context``), else None.
        #: Drawn last, block by block as Wx's, so that every other draw stays where it was.
        self.Wc: nn.Parameter | None = None
        if config.click_context:
            self.Wc = nn.Parameter(torch.empty(N_CONTEXT, 3 * sizes[0]))
            with torch.no_grad():
                for k in range(3):
                    _fill(self.Wc[:, k * sizes[0]:(k + 1) * sizes[0]], config.sigma, config.init_as_normal, generator)
        #: The composed rows and biases of every item that score_all scores (with attributes).
        self._scored = ComposedCatalogue()
        #: The composed input rows of every item (separate and one-hot modes with attributes).
        self._inputs = ComposedCatalogue()

    # ------------------------------------------------------------------ initialisation

    @torch.no_grad()
    def reset_parameters(self, sigma: float = 0.0, normal: bool = False, generator: torch.Generator | None = None) -> None:
        """Draw every weight block independently (docs/behaviour.md §2): U[−σ, σ] with σ = sqrt(6/(rows+cols))
        of the block unless ``sigma > 0`` fixes it; N(0, σ²) when ``normal``. Biases are zero."""

        def fill(block: Tensor) -> None:
            _fill(block, sigma, normal, generator)

        for layer in self.layers:
            n = layer.size
            for k in range(3):
                fill(layer.Wx[:, k * n:(k + 1) * n])
            fill(layer.Wh)
            for k in range(2):
                fill(layer.Wrz[:, k * n:(k + 1) * n])
            layer.Bh.zero_()
        if self.E is not None:
            fill(self.E)
        fill(self.Wy)
        self.By.zero_()

    # ------------------------------------------------------------------ structure

    @property
    def input_table_name(self) -> str:
        """The :meth:`sparse_parameters` name of the table whose rows feed layer 0."""
        return {"shared": "Wy", "separate": "E", "none": "layers.0.Wx"}[self.mode]

    @property
    def input_table(self) -> nn.Parameter:
        """The table whose rows feed layer 0: ``Wy`` (shared), ``E`` (separate) or ``Wx_0`` (none)."""
        return self.sparse_parameters()[self.input_table_name]

    def sparse_parameters(self) -> dict[str, nn.Parameter]:
        """Item-indexed tables, updated only at the rows a step uses (docs/behaviour.md §6);
        with attributes also the attribute tables (``attributes.cat{c}``, code-indexed)."""
        tables = {"Wy": self.Wy, "By": self.By}
        if self.mode == "separate":
            assert self.E is not None
            tables["E"] = self.E
        elif self.mode == "none":
            tables["layers.0.Wx"] = self.layers[0].Wx
        if self.attributes is not None:
            tables.update(self.attributes.sparse_parameters("attributes."))
        if self.input_attributes is not None:
            tables.update(self.input_attributes.sparse_parameters("input_attributes."))
        return tables

    def dense_parameters(self) -> dict[str, nn.Parameter]:
        """Every other parameter: updated as a whole at every step."""
        sparse = {id(p) for p in self.sparse_parameters().values()}
        return {name: p for name, p in self.named_parameters() if id(p) not in sparse}

    @property
    def n_catalogue(self) -> int:
        """The items :meth:`score_all` scores: the ``n_items`` training items, then (with
        attributes) the cold items of the attribute table, scored from their attributes alone."""
        return self.n_items if self.attributes is None else self.attributes.n_items

    @property
    def input_composition(self) -> ComposedRows | None:
        """The composition of layer 0's input rows (over :attr:`input_table`): ``attributes`` in
        shared mode, ``input_attributes`` in the separate and one-hot modes; None without attributes."""
        return self.attributes if self.mode == "shared" else self.input_attributes

    def compositions(self) -> dict[str, ComposedRows]:
        """The network's compositions by module name (``attributes``, and ``input_attributes``
        in the separate and one-hot modes); empty without attributes."""
        return {name: rows for name in ("attributes", "input_attributes")
                if (rows := getattr(self, name)) is not None}

    def extend_catalogue(self, attributes: ItemAttributes) -> None:
        """Take ``attributes`` — this network's own plus new cold items
        (:meth:`ItemAttributes.add_items`) — as its catalogue: every composition is rebuilt over
        them sharing its trained tables (:meth:`ComposedRows.with_attributes`), so every item
        keeps its rows and the new ones are composed with the trained weights."""
        if self.attributes is None:
            raise ValueError("GRU4RecNet.extend_catalogue: the network has no item attributes")
        self.attributes = self.attributes.with_attributes(attributes)
        if self.input_attributes is not None:
            self.input_attributes = self.input_attributes.with_attributes(attributes)
        self.tables_changed()

    def scored_rows(self, items: Tensor) -> tuple[Tensor, Tensor]:
        """The output rows and biases of ``items`` (B × L, B): ``Wy``'s and ``By``'s, composed
        with the attributes where there are any."""
        if self.attributes is None:
            return self.Wy.index_select(0, items), self.By.index_select(0, items)
        return self.attributes.compose_scored(self.Wy, self.By, items)

    def input_rows(self, items: Tensor) -> Tensor:
        """Layer 0's input rows of ``items``: rows of :attr:`input_table`, composed with
        attributes (:attr:`input_composition`; a cold item's from its attributes alone)."""
        rows = self.input_composition
        if rows is None:
            return self.input_table.index_select(0, items)
        return rows.compose(self.input_table, items)

    @property
    def sizes(self) -> list[int]:
        return [layer.size for layer in self.layers]

    # ------------------------------------------------------------------ forward pieces

    @property
    def uses_context(self) -> bool:
        """Whether layer 0 takes the clicks' context (``config.click_context``: ``Wc`` exists)."""
        return self.Wc is not None

    def layer0_projection(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """``v`` of layer 0 from its input rows (embedding rows, or ``Wx_0`` rows in none mode)
        and, for a network with click context, the clicks' context (B×5): ``+ context·Wc``.
        ValueError when the two do not go together (context missing, or given to a plain network)."""
        layer = self.layers[0]
        if (context is None) != (self.Wc is None):
            raise ValueError("this network was built with click_context: every step needs its clicks' context (B×5)"
                             if context is None else "click context given to a network built without click_context")
        if self.mode == "none":
            v = x + layer.Bh
        else:
            v = torch.addmm(layer.Bh, x, layer.Wx)
        if self.Wc is not None and context is not None:  # both or neither (checked above)
            v = torch.addmm(v, context, self.Wc)
        return v

    def init_hidden(self, batch_size: int, device: torch.device | str | None = None) -> list[Tensor]:
        """Zero hidden states, one B×L_i tensor per layer."""
        device = self.Wy.device if device is None else device
        return [torch.zeros(batch_size, n, device=device, dtype=self.Wy.dtype) for n in self.sizes]

    def run_layers(self, x: Tensor, hidden: list[Tensor], dropout: Callable[[Tensor, int], Tensor] | None = None,
                   context: Tensor | None = None) -> list[Tensor]:
        """Every layer's output for the input rows ``x`` (embedding rows, or ``Wx_0`` rows in
        none mode) from the states ``hidden`` (not modified). ``dropout(out, i)``, if given, is
        applied to layer i's output, which is both the next layer's input and its new state.
        ``context``: the clicks' context (B×5), for a network with click context only."""
        v = self.layer0_projection(x, context)
        outs = []
        for i, layer in enumerate(self.layers):
            if i > 0:
                v = torch.addmm(layer.Bh, x, layer.Wx)
            x = gru_cell(v, hidden[i], layer.Wh, layer.Wrz, self.hidden_act)
            if dropout is not None:
                x = dropout(x, i)
            outs.append(x)
        return outs

    def step(self, items: Tensor, hidden: list[Tensor], context: Tensor | None = None) -> Tensor:
        """Advance every row by one item: returns the last layer's output (B×L) and overwrites
        ``hidden`` in place. Dropout applies only in training mode (inverted dropout).
        ``context``: the clicks' context (B×5), for a network with click context only."""
        if self.attributes is not None and not torch.is_grad_enabled():
            # Inference (an evaluation, a server): the input rows are rows of a composed catalogue
            # kept between steps, one gather as a plain model's (composing the clicked items anew
            # cost a served click at batch 1 more than the rest of its step).
            x = self._composed_inputs().index_select(0, items)
        else:
            x = self.input_rows(items)
        dropout = None
        if self.training:
            if self.dropout_p_embed > 0:
                x = nn.functional.dropout(x, self.dropout_p_embed)
            if self.dropout_p_hidden > 0:
                dropout = lambda out, i: nn.functional.dropout(out, self.dropout_p_hidden)  # noqa: E731
        outs = self.run_layers(x, hidden, dropout, context)
        for h, out in zip(hidden, outs):
            h.copy_(out)
        return outs[-1]

    def score_all(self, out: Tensor, buffer: Tensor | None = None) -> Tensor:
        """Raw scores of every item: ``out·Wyᵀ + By`` (B×N), written into ``buffer`` if given
        (a B×N tensor reused across steps: no fresh allocation per step). With attributes the
        scores cover the whole catalogue, B × :attr:`n_catalogue` (N training items, then the C
        cold items): ``Wy`` and ``By`` are every item's composed row and bias (composed in chunks
        into a catalogue kept between calls; a cold item's bias is its attributes' part alone)."""
        if self.attributes is not None:
            wy, by = self._composed_catalogue()
            if buffer is None:
                return torch.addmm(by, out, wy.t())
            return torch.addmm(by, out, wy.t(), out=buffer)
        if buffer is None:
            return torch.addmm(self.By, out, self.Wy.t())
        return torch.addmm(self.By, out, self.Wy.t(), out=buffer)

    def tables_changed(self) -> None:
        """Say that ``Wy``, ``By`` or the attribute tables changed in place by a path torch does not see
        (the optimiser's fused CPU rules write through data pointers): the next scores compose the
        catalogue again. The training step calls it after each update."""
        self._scored.forget()
        self._inputs.forget()

    def _composed_catalogue(self) -> tuple[Tensor, Tensor]:
        """The composed rows and biases of every item, warm then cold ((N + C)×L and N + C), kept
        between calls while the tables hold (:class:`~gru4rec.items.rows.ComposedCatalogue`)."""
        assert self.attributes is not None
        rows, bias = self._scored.of(self.attributes, self.Wy, self.By)
        assert bias is not None  # composed with By
        return rows, bias

    def _composed_inputs(self) -> Tensor:
        """Every item's composed input row ((N + C) × d₀): the composed catalogue's rows in shared
        mode, else those of ``input_attributes`` over :attr:`input_table`, kept alike."""
        if self.input_attributes is None:
            return self._composed_catalogue()[0]
        return self._inputs.of(self.input_attributes, self.input_table)[0]
