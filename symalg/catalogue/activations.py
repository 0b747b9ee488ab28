"""The equivariance catalogue: which groups commute with which activations.

Each :class:`CatalogueEntry` holds the activation's SymPy function (which prints itself to torch),
the identity it declares, ``σ(g z) = π(g) σ(z) + τ(g)``, and the groups for which it declares it.
Entries are registered with :func:`register` into a read-only mapping, :data:`CATALOGUE`. An entry
also carries its torch :class:`Spellings` (module classes, functions, tensor methods, ATen overloads),
from which the tracing and ``from_torch`` tables are built (:mod:`symalg.frontend.canonical`): a new
activation is one registration. To add or replace entries for one call, overlay a mapping — never
mutate the global one::

    >>> import symalg
    >>> from symalg.catalogue.activations import CATALOGUE, CatalogueEntry, overlay, declare_odd
    >>> import sympy as sp
    >>> mine = overlay({"sin": CatalogueEntry("sin", lambda z: sp.sin(z), declare_odd())})
    >>> analysis = symalg.derive(symalg.parse("linear(2, 3) -> sin -> linear(3, 1)", catalogue=mine), mine)
    >>> [s.group.name for s in analysis.symmetries]
    ['SignFlips(3)', 'S(3)']

A pointwise entry's function maps a scalar SymPy ``z`` to ``σ(z)``; a radial entry's maps the norm
``r = ‖z‖`` to the scale ``f(r)`` in ``σ(z) = f(‖z‖) z``. Hyper-parameters (a slope, a degree)
are keyword arguments of the function and of the group declaration.
"""
from __future__ import annotations

import math
from collections import ChainMap
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, TypeAlias

import sympy as sp
import torch
import torch.nn.functional as F
from sympy.printing.printer import Printer

from symalg.catalogue.groups import (EvenFlips, GeneralLinear, Orthogonal, Permutations, PositiveScaling, SignFlips,
                                     SiteGroup, SiteOption, SiteWidth)
from symalg.frontend.grammar import parse_number

nn = torch.nn

__all__ = ["CATALOGUE", "CatalogueEntry", "Spellings", "register", "overlay", "declare_linear", "declare_homogeneous",
           "declare_leaky", "declare_odd", "declare_even_homogeneous", "declare_pointwise", "declare_radial", "exact"]


def exact(value: object) -> sp.Expr:
    """A hyper-parameter as an exact SymPy number: floats by their decimal repr (``0.2`` → ``1/5``),
    never guessed into irrationals (``0.7071067811865476`` stays that decimal, not ``√2/2``).

    Text is read by the spec grammar (:func:`symalg.frontend.grammar.parse_number`: numbers, ``+ - * /`` of
    numbers, plain names, which become symbols), never evaluated; other objects must be SymPy numbers
    or convertible to them without parsing (``sympify(strict=True)``).
    """
    if isinstance(value, bool):
        raise ValueError(f"hyper-parameter {value!r} is not a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"hyper-parameter {value!r} is not a finite number")
        return sp.Rational(repr(value))
    if isinstance(value, str):
        value = parse_number(value, f"hyper-parameter {value!r}")
        return sp.Symbol(value) if isinstance(value, str) else sp.sympify(value)
    try:
        return sp.sympify(value, strict=True)
    except sp.SympifyError:
        raise ValueError(f"hyper-parameter {value!r} ({type(value).__name__}) is not a number") from None

GroupDeclaration: TypeAlias = Callable[..., tuple[SiteGroup, ...]]
ActivationFunction: TypeAlias = Callable[..., sp.Expr]


# -- SymPy activation functions that print themselves to torch ----------------------------------
class _TorchActivation(sp.Function):
    """A scalar SymPy function printed as a ``torch.nn.functional`` call, exactly as torch defines it.

    Arguments after the first are hyper-parameters, passed on positionally (``F.elu(z, alpha)``);
    ``torch_keywords`` is appended verbatim (``approximate='tanh'``).
    """

    torch_name: str = ""
    torch_keywords: str = ""
    nargs = 1

    def _torchcode(self, printer: Printer) -> str:
        arguments = [printer._print(a) for a in self.args] + ([self.torch_keywords] if self.torch_keywords else [])
        return f"{printer._module_format('torch.nn.functional.' + self.torch_name)}({', '.join(arguments)})"

    def _latex(self, printer: Printer) -> str:
        arguments = ", ".join(printer._print(a) for a in self.args)
        name = type(self).__name__.replace("_", r"\_")
        return rf"\operatorname{{{name}}}\left({arguments}\right)"

    def _eval_is_real(self) -> bool | None:
        return self.args[0].is_real


class sigmoid(_TorchActivation):
    """``σ(z) = 1 / (1 + e^{−z})``; satisfies ``σ(−z) = 1 − σ(z)``."""

    torch_name = "sigmoid"

    def _torchcode(self, printer: Printer) -> str:
        return f"{printer._module_format('torch.sigmoid')}({printer._print(self.args[0])})"

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return sigmoid(self.args[0]) * (1 - sigmoid(self.args[0]))

    def _eval_rewrite_as_exp(self, z: sp.Expr, **kwargs: Any) -> sp.Expr:
        return 1 / (1 + sp.exp(-z))


class gelu(_TorchActivation):
    """Exact GELU, ``z Φ(z) = z (1 + erf(z/√2)) / 2`` (torch's default, ``approximate='none'``)."""

    torch_name = "gelu"

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        z = sp.Dummy("z")
        return self._eval_rewrite_as_erf(z).diff(z).subs(z, self.args[0])

    def _eval_rewrite_as_erf(self, z: sp.Expr, **kwargs: Any) -> sp.Expr:
        return z * (1 + sp.erf(z / sp.sqrt(2))) / 2


class silu(_TorchActivation):
    """SiLU / swish, ``z σ(z)``."""

    torch_name = "silu"

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        z = self.args[0]
        return sigmoid(z) + z * sigmoid(z) * (1 - sigmoid(z))

    def _eval_rewrite_as_exp(self, z: sp.Expr, **kwargs: Any) -> sp.Expr:
        return z / (1 + sp.exp(-z))


class softplus(_TorchActivation):
    """``log(1 + e^z)`` (torch's ``beta=1``; torch returns ``z`` itself above ``z > 20``)."""

    torch_name = "softplus"

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return sigmoid(self.args[0])

    def _eval_rewrite_as_exp(self, z: sp.Expr, **kwargs: Any) -> sp.Expr:
        return sp.log(1 + sp.exp(z))


class gelu_tanh(_TorchActivation):
    """GELU's tanh approximation, ``z (1 + tanh(√(2/π) (z + 0.044715 z³))) / 2`` (``approximate='tanh'``)."""

    torch_name, torch_keywords = "gelu", "approximate='tanh'"


class hardswish(_TorchActivation):
    """``z · relu6(z + 3) / 6``."""

    torch_name = "hardswish"


class relu6(_TorchActivation):
    """``min(max(z, 0), 6)``."""

    torch_name = "relu6"


class mish(_TorchActivation):
    """``z tanh(softplus(z))``."""

    torch_name = "mish"


class selu(_TorchActivation):
    """``λ elu(z, α)`` with torch's fixed ``λ ≈ 1.0507``, ``α ≈ 1.6733``."""

    torch_name = "selu"


class elu(_TorchActivation):
    """``z`` for ``z > 0``, ``α (e^z − 1)`` otherwise; the second argument is ``α``."""

    torch_name = "elu"
    nargs = 2


class hardtanh(_TorchActivation):
    """``min(max(z, −1), 1)``; odd, which :meth:`hardtanh.eval` states (``hardtanh(−z) → −hardtanh(z)``,
    ``hardtanh(0) → 0``) so that the sign-flip identity is decided symbolically; the catalogue law
    tests check it numerically against torch's function."""

    torch_name = "hardtanh"

    @classmethod
    def eval(cls, z: sp.Expr) -> sp.Expr | None:
        if z.is_zero:
            return sp.S.Zero
        if z.could_extract_minus_sign():
            return -cls(-z)
        return None


class hardsigmoid(_TorchActivation):
    """``min(max(z / 6 + 1/2, 0), 1)``; symmetric about ``(0, 1/2)``, which :meth:`hardsigmoid.eval` states
    (``hardsigmoid(−z) → 1 − hardsigmoid(z)``, ``hardsigmoid(0) → 1/2``), checked numerically by the
    catalogue law tests."""

    torch_name = "hardsigmoid"

    @classmethod
    def eval(cls, z: sp.Expr) -> sp.Expr | None:
        if z.is_zero:
            return sp.Rational(1, 2)
        if z.could_extract_minus_sign():
            return 1 - cls(-z)
        return None


# -- group declarations --------------------------------------------------------------------------
def declare_linear() -> GroupDeclaration:
    """Identity activation: ``σ(g z) = g σ(z)`` for all of ``GL(h)``."""
    return lambda width, **_: (GeneralLinear(width),)


def declare_homogeneous(degree_param: str | None = None, degree: SiteOption = 1) -> GroupDeclaration:
    """Positively homogeneous pointwise activation of degree α: ``σ(c z) = c^α σ(z)``, ``c > 0``.

    The degree is ``degree``, or the hyper-parameter named ``degree_param`` when given.
    """
    def groups(width: SiteWidth, **params: object) -> tuple[SiteGroup, ...]:
        alpha = exact(params[degree_param]) if degree_param else sp.sympify(degree)
        return PositiveScaling(width, alpha), Permutations(width)
    return groups


def declare_leaky() -> GroupDeclaration:
    """Leaky ReLU ``max(z, 0) + s·min(z, 0)``: positively homogeneous of degree 1, and at ``s = 1`` the identity,
    equivariant under all of ``GL(h)``."""
    homogeneous, linear = declare_homogeneous(), declare_linear()
    return lambda width, slope: linear(width) if slope == 1 else homogeneous(width)


def declare_odd(center: SiteOption = 0) -> GroupDeclaration:
    """Pointwise activation symmetric about ``(0, c)``: ``σ(−z) = 2c − σ(z)`` (odd for ``c = 0``)."""
    return lambda width, **_: (SignFlips(width, sp.sympify(center)), Permutations(width))


def declare_even_homogeneous() -> GroupDeclaration:
    """Even and positively homogeneous of degree 1, ``σ(c z) = |c| σ(z)`` for ``c ≠ 0`` (``|z|``): positive scaling
    (the continuous part; readers move by ``c⁻¹``) and the sign flips of the input alone (:class:`EvenFlips`:
    ``σ(−z) = σ(z)``, the readers stay), with the permutations."""
    return lambda width, **_: (PositiveScaling(width), EvenFlips(width), Permutations(width))


def declare_pointwise() -> GroupDeclaration:
    """Any pointwise activation: neuron permutations and nothing more."""
    return lambda width, **_: (Permutations(width),)


def declare_radial() -> GroupDeclaration:
    """Radial rescaling ``σ(z) = f(‖z‖) z``: ``σ(g z) = g σ(z)`` for all of ``O(h)``."""
    return lambda width, **_: (Orthogonal(width),)


def _no_hyper_parameters(arguments: Mapping[str, object]) -> dict[str, object]:
    return {}


@dataclass(frozen=True)
class Spellings:
    """How torch writes one catalogue entry; the front ends' op tables are built from these.

    Parameters
    ----------
    modules : module classes, matched by exact type (a subclass may compute something else).
    functions : functional forms, in-place ones included (``F.relu``, ``torch.relu``, ``F.relu_``).
    methods : tensor-method names, in-place ``_`` forms included (``"relu"``, ``"relu_"``).
    aten : ATen overloads as ``torch.export`` shows them (``"aten.relu.default"``).
    arguments : torch's names of the hyper-parameters a module stores and a call takes
        (``"negative_slope"``; a module lacking one, or a call not taking it, leaves it out).
    read : ``read({torch name: value}) -> hyper-parameters | None``: the entry's hyper-parameters, or
        ``None`` where the entry does not cover torch's settings (``GELU(approximate='tanh')`` is not
        exact GELU), so that another entry, or none, takes the op.

    Example
    -------
    >>> CATALOGUE["leaky_relu"].spellings.read({"negative_slope": 0.2})
    {'slope': 0.2}
    """

    modules: tuple[type, ...] = ()
    functions: tuple[Callable[..., Any], ...] = ()
    methods: tuple[str, ...] = ()
    aten: tuple[str, ...] = ()
    arguments: tuple[str, ...] = ()
    read: Callable[[Mapping[str, Any]], Mapping[str, object] | None] = _no_hyper_parameters


@dataclass(frozen=True, eq=False)
class CatalogueEntry:
    """One activation: its SymPy function, its declared identity (via its groups), its groups.

    Parameters
    ----------
    name : canonical op name (``"relu"``).
    function : ``function(z, **params)``: σ(z) for a scalar SymPy ``z`` (pointwise), or the scale
        ``f(r)`` at ``r = ‖z‖`` (radial).
    groups : ``groups(width, **params)``: the groups the activation is declared equivariant under.
    radial : ``True`` when the activation acts on the whole feature vector through its norm.
    defaults : default hyper-parameters (``{"slope": 0.01}``).
    positive : hyper-parameters that must be positive (a homogeneity degree).
    spellings : how torch writes the activation (none for an entry torch lacks, such as ``radial``).
    """

    name: str
    function: Callable[..., sp.Expr]
    groups: GroupDeclaration
    radial: bool = False
    defaults: Mapping[str, object] = field(default_factory=dict)
    positive: tuple[str, ...] = ()
    spellings: Spellings = Spellings()

    def expression(self, z: sp.Symbol, **params: object) -> sp.Expr:
        """``σ(z)`` (pointwise) or ``f(z)`` (radial) with defaults filled in."""
        return self.function(z, **self.resolve(params))

    def resolve(self, params: Mapping[str, object]) -> dict[str, sp.Expr]:
        """Defaults merged with ``params`` as exact numbers; unknown hyper-parameters raise, naming the entry."""
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise ValueError(f"activation {self.name!r} has no hyper-parameter {sorted(unknown)} "
                             f"(it takes {sorted(self.defaults) or 'none'})")
        resolved = {k: exact(v) for k, v in {**self.defaults, **params}.items()}
        for key, value in resolved.items():
            if not (value.is_number and value.is_finite and value.is_real):
                raise ValueError(f"activation {self.name!r}: hyper-parameter {key}={value} must be a finite real "
                                 "number")
            if key in self.positive and not value.is_positive:
                raise ValueError(f"activation {self.name!r}: hyper-parameter {key}={value} must be positive")
        return resolved

    def site_groups(self, width: SiteWidth, **params: object) -> tuple[SiteGroup, ...]:
        return self.groups(width, **self.resolve(params))


_REGISTRY: dict[str, CatalogueEntry] = {}
CATALOGUE: Mapping[str, CatalogueEntry] = MappingProxyType(_REGISTRY)
"""The built-in catalogue (read-only); extend it per call with :func:`overlay`."""


def register(name: str, groups: GroupDeclaration, *, radial: bool = False, positive: tuple[str, ...] = (),
             spellings: Spellings = Spellings(),
             **defaults: object) -> Callable[[ActivationFunction], ActivationFunction]:
    """Decorator registering ``function`` as the built-in entry ``name`` (``defaults``: hyper-parameters;
    ``spellings``: how torch writes it, which is all the front ends need to recognise it)."""
    def decorate(function: ActivationFunction) -> ActivationFunction:
        if name in _REGISTRY:
            raise ValueError(f"catalogue entry {name!r} is already registered")
        if not isinstance(spellings, Spellings):
            raise ValueError(f"catalogue entry {name!r}: spellings must be a Spellings, got {type(spellings).__name__}")
        _REGISTRY[name] = CatalogueEntry(name, function, groups, radial, MappingProxyType(defaults), positive,
                                         spellings)
        return function
    return decorate


def overlay(entries: Mapping[str, CatalogueEntry],
            base: Mapping[str, CatalogueEntry] = CATALOGUE) -> Mapping[str, CatalogueEntry]:
    """A catalogue in which ``entries`` add to or replace those of ``base`` (which is untouched)."""
    for key, entry in entries.items():
        if not isinstance(entry, CatalogueEntry) or entry.name != key:
            raise ValueError(f"overlay: entry {key!r} must be a CatalogueEntry named {key!r}")
    # ChainMap writes to its first map only; typeshed asks every map to be mutable, base is read-only
    return ChainMap(dict(entries), base)  # type: ignore[arg-type]


@register("identity", declare_linear(), spellings=Spellings(modules=(nn.Identity,)))
def _identity(z: sp.Expr) -> sp.Expr:
    return z


@register("relu", declare_homogeneous(), spellings=Spellings(
    modules=(nn.ReLU,),
    functions=(F.relu, torch.relu, F.relu_, torch.relu_),
    methods=("relu", "relu_"),
    aten=("aten.relu.default", "aten.relu_.default")))
def _relu(z: sp.Expr) -> sp.Expr:
    return sp.Max(z, 0)


@register("leaky_relu", declare_leaky(), slope=sp.Rational(1, 100), spellings=Spellings(
    modules=(nn.LeakyReLU,),
    functions=(F.leaky_relu, F.leaky_relu_),
    aten=("aten.leaky_relu.default", "aten.leaky_relu_.default"),
    arguments=("negative_slope",),
    read=lambda torch_args: {"slope": torch_args.get("negative_slope", 0.01)}))
def _leaky_relu(z: sp.Expr, slope: sp.Expr) -> sp.Expr:
    if exact(slope) == 1:
        return z    # max(z, 0) + min(z, 0), which SymPy does not reduce to z by itself
    return sp.Max(z, 0) + exact(slope) * sp.Min(z, 0)


@register("relu_pow", declare_homogeneous("alpha"), positive=("alpha",), alpha=2)
def _relu_pow(z: sp.Expr, alpha: sp.Expr) -> sp.Expr:
    return sp.Max(z, 0) ** exact(alpha)


@register("tanh", declare_odd(), spellings=Spellings(
    modules=(nn.Tanh,),
    functions=(torch.tanh, F.tanh, torch.tanh_),
    methods=("tanh", "tanh_"),
    aten=("aten.tanh.default", "aten.tanh_.default")))
def _tanh(z: sp.Expr) -> sp.Expr:
    return sp.tanh(z)


@register("sigmoid", declare_odd(center=sp.Rational(1, 2)), spellings=Spellings(
    modules=(nn.Sigmoid,),
    functions=(torch.sigmoid, F.sigmoid, torch.sigmoid_),
    methods=("sigmoid", "sigmoid_"),
    aten=("aten.sigmoid.default", "aten.sigmoid_.default")))
def _sigmoid(z: sp.Expr) -> sp.Expr:
    return sigmoid(z)


@register("abs", declare_even_homogeneous(), spellings=Spellings(
    functions=(torch.abs, torch.abs_, torch.absolute),
    methods=("abs", "abs_", "absolute", "absolute_"),
    aten=("aten.abs.default", "aten.abs_.default")))
def _abs(z: sp.Expr) -> sp.Expr:
    return sp.Abs(z)


def _only_at(**settings: object) -> Callable[[Mapping[str, object]], dict[str, object] | None]:
    """``read`` of an entry without hyper-parameters that covers torch's op only at ``settings``
    (a setting the module or call lacks counts as matching: ``F.relu6`` has no ``min_val``)."""
    return lambda torch_args: {} if all(torch_args.get(k, v) == v for k, v in settings.items()) else None


@register("gelu", declare_pointwise(), spellings=Spellings(
    modules=(nn.GELU,),
    functions=(F.gelu,),
    aten=("aten.gelu.default", "aten.gelu_.default"),
    arguments=("approximate",),
    read=_only_at(approximate="none")))
def _gelu(z: sp.Expr) -> sp.Expr:
    return gelu(z)


@register("silu", declare_pointwise(), spellings=Spellings(
    modules=(nn.SiLU,),
    functions=(F.silu,),
    aten=("aten.silu.default", "aten.silu_.default")))
def _silu(z: sp.Expr) -> sp.Expr:
    return silu(z)


@register("softplus", declare_pointwise(), spellings=Spellings(
    modules=(nn.Softplus,),
    functions=(F.softplus,),
    aten=("aten.softplus.default",),
    arguments=("beta", "threshold"),
    read=_only_at(beta=1, threshold=20)))
def _softplus(z: sp.Expr) -> sp.Expr:
    return softplus(z)


@register("gelu_tanh", declare_pointwise(), spellings=Spellings(
    modules=(nn.GELU,),
    functions=(F.gelu,),
    aten=("aten.gelu.default", "aten.gelu_.default"),
    arguments=("approximate",),
    read=_only_at(approximate="tanh")))
def _gelu_tanh(z: sp.Expr) -> sp.Expr:
    return gelu_tanh(z)


@register("hardtanh", declare_odd(), spellings=Spellings(
    modules=(nn.Hardtanh,),
    functions=(F.hardtanh, F.hardtanh_),
    aten=("aten.hardtanh.default", "aten.hardtanh_.default"),
    arguments=("min_val", "max_val"),
    read=_only_at(min_val=-1, max_val=1)))
def _hardtanh(z: sp.Expr) -> sp.Expr:
    return hardtanh(z)


@register("relu6", declare_pointwise(), spellings=Spellings(
    modules=(nn.ReLU6, nn.Hardtanh),
    functions=(F.relu6, F.hardtanh, F.hardtanh_),
    aten=("aten.relu6.default", "aten.hardtanh.default", "aten.hardtanh_.default"),
    arguments=("min_val", "max_val"),
    read=_only_at(min_val=0, max_val=6)))
def _relu6(z: sp.Expr) -> sp.Expr:
    return relu6(z)


@register("hardswish", declare_pointwise(), spellings=Spellings(
    modules=(nn.Hardswish,),
    functions=(F.hardswish,),
    aten=("aten.hardswish.default", "aten.hardswish_.default")))
def _hardswish(z: sp.Expr) -> sp.Expr:
    return hardswish(z)


@register("hardsigmoid", declare_odd(center=sp.Rational(1, 2)), spellings=Spellings(
    modules=(nn.Hardsigmoid,),
    functions=(F.hardsigmoid,),
    aten=("aten.hardsigmoid.default", "aten.hardsigmoid_.default")))
def _hardsigmoid(z: sp.Expr) -> sp.Expr:
    return hardsigmoid(z)


@register("elu", declare_pointwise(), alpha=1, spellings=Spellings(
    modules=(nn.ELU,),
    functions=(F.elu, F.elu_),
    aten=("aten.elu.default", "aten.elu_.default"),
    arguments=("alpha", "scale", "input_scale"),
    read=lambda torch_args: {"alpha": torch_args.get("alpha", 1)}
    if (torch_args.get("scale", 1), torch_args.get("input_scale", 1)) == (1, 1) else None))
def _elu(z: sp.Expr, alpha: sp.Expr) -> sp.Expr:
    return elu(z, exact(alpha))


@register("mish", declare_pointwise(), spellings=Spellings(
    modules=(nn.Mish,),
    functions=(F.mish,),
    aten=("aten.mish.default",)))
def _mish(z: sp.Expr) -> sp.Expr:
    return mish(z)


@register("selu", declare_pointwise(), spellings=Spellings(
    modules=(nn.SELU,),
    functions=(F.selu, torch.selu),
    aten=("aten.selu.default", "aten.selu_.default")))
def _selu(z: sp.Expr) -> sp.Expr:
    return selu(z)


class inverse_hypot(_TorchActivation):
    """``1 / √(1 + r²)``, printed as ``1 / hypot(1, r)`` so that large ``r`` cannot overflow."""

    def _torchcode(self, printer: Printer) -> str:
        r = printer._print(self.args[0])
        return f"torch.reciprocal(torch.hypot(torch.ones_like({r}), {r}))"

    def _latex(self, printer: Printer) -> str:
        return rf"\left(1 + {printer._print(self.args[0])}^{{2}}\right)^{{-1/2}}"

    def _eval_rewrite_as_sqrt(self, r: sp.Expr, **kwargs: Any) -> sp.Expr:
        return 1 / sp.sqrt(1 + r ** 2)

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        return -self.args[0] * inverse_hypot(self.args[0]) ** 3


@register("radial", declare_radial(), radial=True)
def _radial(r: sp.Expr) -> sp.Expr:
    """``σ(z) = z / √(1 + ‖z‖²)``: a smooth, bounded radial rescaling."""
    return inverse_hypot(r)
