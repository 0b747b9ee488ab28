"""How a site's group acts on the tensors around it: one :class:`Binding` per tensor region.

A *site* is a feature axis (a hidden layer's neurons, a conv layer's channels, a head's key space,
the residual stream). A binding says that a region of a parameter (or buffer) is indexed by the
site's coordinates along one tensor axis: the slice ``[start, start + width·block)`` of ``axis``,
``block`` consecutive entries per coordinate (``block > 1`` where a conv's channels are flattened
into a dense layer, or where a head-permutation moves whole heads). Unfolding the region gives a
``width × rest`` matrix ``U``, and a group element ``g`` with representation ``π`` acts by

    out-binding (the site's coordinates index outputs, e.g. rows of ``W``, biases):  U ↦ π(g) U
    in-binding  (they index inputs, e.g. columns of the next ``W``):                U ↦ π(g)⁻ᵀ U

so ``W ↦ π(g) W`` for a producer and ``W ↦ W π(g)⁻¹`` for a consumer, whatever the tensor's rank.
Positive scaling acts with ``π(d) = d^power`` (the power a value carries after homogeneous
activations; 0 after a normalisation that cancels the scaling). Infinitesimally ``M`` acts by
``U ↦ power·M U`` and ``U ↦ −power·Mᵀ U``, so for symmetric ``M``

    Q_M(θ) = ⟨θ, M·θ⟩ = tr(M C),   C = Σ_out power·U Uᵀ − Σ_in power·U Uᵀ.

>>> import torch
>>> b = Binding("fc.weight", axis=1, start=0, width=3, role="in")
>>> W = torch.arange(6.).reshape(2, 3)
>>> b.unfold(W).shape
torch.Size([3, 2])
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Mapping, Sequence

import torch

__all__ = ["Absorber", "Binding", "TranslationFamily"]


@dataclass(frozen=True)
class Binding:
    """A region of tensor ``tensor`` indexed by a site's coordinates (see the module docstring).

    ``diagonal`` marks the diagonal of a diagonal map (a norm's gain, a depthwise kernel): it carries
    an out- and an in-binding of the same region, and a permutation moves it once.
    """

    tensor: str
    axis: int
    start: int
    width: int
    block: int = 1
    role: str = "out"
    power: Fraction = Fraction(1)
    buffer: bool = False
    diagonal: bool = False
    node: str = ""
    invariant: frozenset = frozenset()
    """Kinds that leave the region where it is: a reader of an even activation's output under the flips of its input
    (:class:`~symalg.catalogue.groups.EvenFlips`)."""

    @property
    def region(self) -> tuple:
        """What identifies the region: tensor, axis, slice and block."""
        return (self.tensor, self.axis, self.start, self.width, self.block)

    def restrict(self, offset: int, width: int) -> "Binding":
        """The binding of coordinates ``[offset, offset + width)`` only (one head of a site)."""
        return replace(self, start=self.start + offset * self.block, width=width)

    def coarsen(self, factor: int) -> "Binding":
        """Group ``factor`` consecutive coordinates into one (heads as the coordinates of a permutation)."""
        return replace(self, width=self.width // factor, block=self.block * factor)

    def flipped(self) -> "Binding":
        """The dual binding (a key map transforms by ``π(g)⁻ᵀ`` where the query map has ``π(g)``)."""
        return replace(self, role="in" if self.role == "out" else "out")

    def is_whole(self, tensor: torch.Tensor) -> bool:
        """The region is all of ``tensor`` (no slice to take)."""
        return self.start == 0 and self.width * self.block == tensor.shape[self.axis]

    def unfold(self, tensor: torch.Tensor) -> torch.Tensor:
        """The region as a ``width × rest`` matrix (coordinate-major), batched over nothing."""
        region = tensor if self.is_whole(tensor) else tensor.narrow(self.axis, self.start, self.width * self.block)
        region = region if self.axis == 0 else region.movedim(self.axis, 0)
        return region if region.dim() == 2 and self.block == 1 else region.reshape(self.width, -1)

    def fold(self, tensor: torch.Tensor, unfolded: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        """``tensor`` with the region replaced by ``unfolded`` (the inverse of :meth:`unfold`); a copy, or
        ``tensor`` itself written to with ``inplace``. ``unfolded`` must be a new tensor, not a view of ``tensor``:
        where the region is the whole tensor it becomes the result without a copy."""
        whole = self.is_whole(tensor)
        if whole and not inplace and self.axis == 0:   # the moved values (computed afresh) are the new tensor
            return unfolded if unfolded.shape == tensor.shape else unfolded.reshape(tensor.shape)
        shape = list(tensor.shape)
        shape.insert(0, shape.pop(self.axis))
        shape[0] = self.width * self.block
        folded = unfolded if list(unfolded.shape) == shape else unfolded.reshape(shape)
        folded = folded if self.axis == 0 else folded.movedim(0, self.axis)
        if whole:
            return tensor.copy_(folded) if inplace else folded
        end = self.start + self.width * self.block
        if not inplace:   # out of place, so that a tangent folds under torch.func.vmap
            return tensor.slice_scatter(folded, self.axis, self.start, end)
        tensor.narrow(self.axis, self.start, end - self.start).copy_(folded)
        return tensor

    def scale(self, tensor: torch.Tensor, diagonal: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        """``tensor`` with the region's coordinate ``i`` (its ``block`` entries along the axis) multiplied by
        ``diagonal[i]``: :meth:`fold` of ``diag(diagonal) ·`` :meth:`unfold`, computed where the region lies (the
        factors broadcast along its axis; no axis moved, no region copied first). A copy, or ``tensor`` itself
        written to with ``inplace``.

        >>> Binding("w", axis=1, start=1, width=2).scale(torch.ones(2, 3), torch.tensor([2.0, 3.0])).tolist()
        [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
        """
        factors = diagonal if self.block == 1 else diagonal.repeat_interleave(self.block)
        shape = [1] * tensor.dim()
        shape[self.axis] = factors.shape[0]
        factors = factors.reshape(shape)
        if self.is_whole(tensor):
            return tensor.mul_(factors) if inplace else tensor * factors
        end = self.start + self.width * self.block
        region = tensor.narrow(self.axis, self.start, end - self.start)
        if inplace:
            region.mul_(factors)
            return tensor
        return tensor.slice_scatter(region * factors, self.axis, self.start, end)

    def reading(self, tensor: torch.Tensor, out_axis: int = 0) -> torch.Tensor:
        """The region of a map's weight ``tensor`` as a ``width × out`` matrix: row ``c`` is what a unit input at
        coordinate ``c`` adds to the map's output (axis ``out_axis``), summed over the coordinate's block and
        every other axis (a convolution's kernel positions). For a dense ``W`` read along its columns this is
        ``W[:, start:start + width]ᵀ``.

        >>> W = torch.arange(6.).reshape(2, 3)
        >>> Binding("W", axis=1, start=1, width=2, role="in").reading(W)
        tensor([[1., 4.],
                [2., 5.]])
        """
        region = tensor.narrow(self.axis, self.start, self.width * self.block).movedim((self.axis, out_axis), (0, 1))
        return region.reshape(self.width, self.block, region.shape[1], -1).sum((1, 3))

    def read_source(self, shape: tuple) -> str:
        """Python source that unfolds the region from ``params[tensor]`` (used in lowered code)."""
        code = ""
        size = shape[self.axis]
        if self.start != 0 or self.width * self.block != size:
            code += f".narrow({self.axis}, {self.start}, {self.width * self.block})"
        if self.axis != 0:
            code += f".movedim({self.axis}, 0)"
        if len(shape) != 2 or self.block != 1 or self.axis != 0:
            code += f".reshape({self.width}, -1)"
        return code

    def describe(self) -> str:
        axis = {0: "rows", 1: "columns"}.get(self.axis, f"axis {self.axis}")
        span = f"[{self.start}:{self.start + self.width * self.block}]"
        block = f" in blocks of {self.block}" if self.block != 1 else ""
        return f"{self.tensor} {axis}{span}{block} ({self.role})"


@dataclass(frozen=True)
class Absorber:
    """A map ``y = W x + b`` reading coordinates of a value that moves by a constant vector ``τ`` (the same at every
    position: a translated bias, the shift of an affine sign flip): its output moves by ``Σ_c τ_c W[:, c]`` (summed
    over the coordinate's block and kernel positions; :meth:`Binding.reading`), which its bias absorbs,
    ``b ↦ b − Σ_c τ_c W[:, c]``. ``columns`` is the region of ``W`` reading the moved coordinates (an in-binding),
    ``out_axis`` the axis of ``W`` indexing the outputs (1 for ``addmm``'s ``(in, out)`` weight), ``node`` the map.

    >>> W = torch.tensor([[1., 2.], [3., 4.], [5., 6.]])
    >>> reader = Absorber("b", Binding("W", 1, 0, 2, role="in"))
    >>> reader.absorbed({"W": W}, torch.tensor([1., -1.]))     # W τ, which b gives back
    tensor([-1., -1., -1.])
    """

    bias: str
    columns: Binding
    out_axis: int = 0
    node: str = ""

    @property
    def weight(self) -> str:
        return self.columns.tensor

    def absorbed(self, params: Mapping[str, torch.Tensor], shift: torch.Tensor) -> torch.Tensor:
        """``Σ_c shift_c W[:, c]`` (batched over leading axes of ``shift``): what the bias must give back."""
        return shift @ self.columns.reading(params[self.weight], self.out_axis)

    def describe(self) -> str:
        return f"{self.bias} absorbs −{self.columns.describe()} t"


@dataclass(frozen=True)
class TranslationFamily:
    """Translation directions ``B_i`` moving the ``regions`` together: ``θ ↦ θ + Σ_i t_i B_i``.

    ``pattern`` says what ``B_i`` puts into each region (a :class:`Binding`, unfolded to ``width × rest``):

    - ``"entries"``: ``e_i`` in every region (a bias alone; a bias and the running mean it feeds in eval
      mode), one direction per entry;
    - ``"rows"``: ``1 e_jᵀ``, the same change to every row of a weight, one direction per row entry;
    - ``"ones"``: a single direction, ``1`` in every region (the biases of one group under group norm);
    - ``"opposite"``: ``e_i`` in the first region and ``−e_i`` in the others, one direction per entry (two biases
      that enter only as their sum, a recurrent layer's ``b_ih + b_hh``: the conserved quantity is their difference).

    The first region is the one whose change is the change of the site's value (a producer's bias). With
    ``absorbers`` (maps reading that value, :class:`Absorber`) every direction also moves each reader's bias by
    ``−W[:, c] v``, ``v`` the first region's change: the direction depends on the readers' weights at the current
    parameters, ``B_i(θ)``, an action affine in ``θ`` (a *shear*: the value bias moved into the output bias, a
    norm's bias absorbed by the next layer). Directions of one family still commute (no reader's weight moves), so
    ``t`` composes by addition.

    >>> import torch
    >>> family = TranslationFamily("ones", (Binding("b", 0, 2, 2),))
    >>> family.directions({"b": torch.zeros(5)})
    [{'b': tensor([0., 0., 1., 1., 0.])}]
    >>> reader = Absorber("c", Binding("W", 1, 0, 2, role="in"))
    >>> sheared = TranslationFamily("entries", (Binding("b", 0, 0, 2),), (reader,))
    >>> sheared.directions({"b": torch.zeros(2), "c": torch.zeros(1), "W": torch.tensor([[3., 5.]])})[1]
    {'b': tensor([0., 1.]), 'c': tensor([-5.])}
    """

    pattern: str
    regions: tuple[Binding, ...]
    absorbers: tuple[Absorber, ...] = ()

    @property
    def sheared(self) -> bool:
        """The directions depend on the parameters (readers' biases absorb the move)."""
        return bool(self.absorbers)

    @property
    def moves_buffers(self) -> bool:
        return any(r.buffer for r in self.regions)

    @property
    def parameters(self) -> tuple[str, ...]:
        """The parameters the family translates itself (its regions; not its absorbers' biases)."""
        return tuple(r.tensor for r in self.regions if not r.buffer)

    def absorbable(self, shapes: Mapping[str, Sequence[int]]) -> bool:
        """The first region is a vector indexed by the site's coordinates (a bias, not a buffer), moved by ``e_i``
        or ``1``: its change is the change of the site's value, which readers can absorb (:attr:`absorbers`)."""
        first = self.regions[0]
        return self.pattern in ("entries", "ones") and first.block == 1 and not first.buffer and \
            len(shapes[first.tensor]) == 1

    def count(self, shapes: Mapping[str, Sequence[int]]) -> int:
        """The number of directions, from the tensors' shapes (a region's ``rest``: every axis but its own)."""
        first = self.regions[0]
        rest = 1
        for axis, size in enumerate(shapes[first.tensor]):
            rest *= 1 if axis == first.axis else size
        return {"entries": first.width * first.block * rest, "opposite": first.width * first.block * rest,
                "rows": rest, "ones": 1}[self.pattern]

    def directions(self, params: Mapping[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """``B_i`` as ``{tensor: full-size change}`` at the dtype and device of ``params`` (for a sheared family, at
        the readers' weights in ``params``)."""
        count = self.count({r.tensor: params[r.tensor].shape for r in self.regions})
        reference = params[self.regions[0].tensor]
        basis = torch.eye(count, dtype=reference.dtype, device=reference.device)
        out = [self._constant(params, e) for e in basis]
        if self.absorbers:   # every direction's give-back at once: one product per reader
            first = self.regions[0]
            moves = torch.stack([first.unfold(d[first.tensor]).reshape(-1) for d in out])   # count × width
            for absorber in self.absorbers:
                for direction, change in zip(out, absorber.absorbed(params, moves)):
                    direction[absorber.bias] = direction.get(absorber.bias, 0) - change
        return out

    def move(self, params: Mapping[str, torch.Tensor], t: torch.Tensor) -> dict[str, torch.Tensor]:
        """``Σ_i t_i B_i`` as ``{tensor: full-size change}`` (``t``: :meth:`count` coefficients), at once: what
        :meth:`directions` would give, summed."""
        change = self._constant(params, t)
        if self.absorbers:
            first = self.regions[0]
            moved = first.unfold(change[first.tensor]).reshape(-1)
            for absorber in self.absorbers:
                change[absorber.bias] = change.get(absorber.bias, 0) - absorber.absorbed(params, moved)
        return change

    def _constant(self, params: Mapping[str, torch.Tensor], t: torch.Tensor) -> dict[str, torch.Tensor]:
        """The part of ``Σ_i t_i B_i`` on the family's own regions (the pattern filled with ``t``)."""
        change = {}
        for position, region in enumerate(self.regions):
            tensor = params[region.tensor]
            unfolded = torch.zeros_like(region.unfold(tensor))
            if self.pattern == "entries":
                unfolded += t.reshape(unfolded.shape)
            elif self.pattern == "opposite":
                unfolded += t.reshape(unfolded.shape) if position == 0 else -t.reshape(unfolded.shape)
            elif self.pattern == "rows":
                unfolded += t[None, :]
            else:
                unfolded += t
            change[region.tensor] = region.fold(torch.zeros_like(tensor), unfolded)
        return change

    def extended(self, region: Binding) -> "TranslationFamily":
        """The family moving ``region`` too (a running mean that must follow its bias)."""
        return replace(self, regions=self.regions + (region,))
