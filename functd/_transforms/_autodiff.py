"""Autodiff transforms over pytrees of TensorDicts: grad, value_and_grad, jacrev,
jacfwd, hessian, jvp, vjp.

Each one is ``torch.func``'s transform with checks at the boundary: the inputs
to differentiate must be floating tensors (the message names the path), the
function must return what the transform needs (a scalar for ``grad``: the
message names the shape or type it got, and what to do), and tangents or
cotangents must match the primals or outputs. Gradients come back shaped like
the inputs (TensorDicts with the same keys and batch sizes); Jacobians are
trees of the outputs whose leaves are trees of the inputs, with batch sizes
that stay valid (``[*output_shape, *input_batch_size]`` for the inner ones).

Example:
    >>> loss = lambda p, td: (m(p, td)["y"] ** 2).mean()
    >>> grads = fd.grad(loss)(params, td)               # a TensorDict like params
    >>> value, grads = fd.value_and_grad(loss)(params, td)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, overload

import torch
import torch.utils._pytree as torch_pytree

from .._eager import plain
from .._td import TensorDict, from_parts
from .._td._marks import keep_marks
from .._td._tensordict import is_dynamo_compiling
from .._td._tree import flat_leaves, spec_of, tree, unflatten_like
from ._compose import derived, is_jitted
from ._paths import fmt_path

__all__ = ["grad", "hessian", "jacfwd", "jacrev", "jvp", "value_and_grad", "vjp"]

Argnums = int | tuple[int, ...]
_P = ParamSpec("_P")
_T = TypeVar("_T")  # the (first) argument differentiated: the gradient's type
_R = TypeVar("_R")  # the value
_A = TypeVar("_A")  # the aux output


def _name(f: Callable[..., Any]) -> str:
    return getattr(f, "__name__", None) or type(f).__name__


# ------------------------------------------------------------------ checks
def _argnums(where: str, argnums: Any, n: int) -> tuple[int, ...]:
    nums = argnums if isinstance(argnums, tuple) else (argnums,)
    if not nums or not all(isinstance(i, int) and not isinstance(i, bool) for i in nums):
        raise TypeError(
            f"{where}: argnums must be an int or a non-empty tuple of ints; got {argnums!r}."
        )
    norm = tuple(i + n if i < 0 else i for i in nums)
    bad = [i for i, j in zip(nums, norm) if not 0 <= j < n]
    if bad:
        raise ValueError(
            f"{where}: argnums={argnums!r} but the function was called with {n} positional "
            f"argument(s); argnum {bad[0]} does not exist. Pass what to differentiate "
            "positionally (keyword arguments are never differentiated)."
        )
    if len(set(norm)) != len(norm):
        raise ValueError(f"{where}: argnums={argnums!r} names an argument twice.")
    return norm


def _paths(tree: Any) -> tuple[list[Any], list[Any], Any]:
    pairs, spec = torch_pytree.tree_flatten_with_path(tree)
    return [p for p, _ in pairs], [v for _, v in pairs], spec


def _differentiable(leaf: Any) -> bool:
    return isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex())


def _check_diff_inputs(where: str, args: tuple[Any, ...], nums: tuple[int, ...]) -> None:
    for i in nums:
        if all(map(_differentiable, torch_pytree.tree_leaves(args[i]))):
            continue  # the common case: no paths needed
        paths, leaves, _ = _paths(args[i])
        for p, leaf in zip(paths, leaves):
            if _differentiable(leaf):
                continue
            why = (
                f"has dtype {leaf.dtype}; only floating (or complex) tensors can be "
                "differentiated. Hold it out of what is differentiated: `params, held = "
                "fd.partition(params, fd.trainable(model))` (fd.trainable(params) holds out "
                "every non-floating entry) and call the model on `fd.combine(params, held)`; "
                "or pass it in an argument that argnums does not name."
                if isinstance(leaf, torch.Tensor)
                else f"is a {type(leaf).__name__}, not a tensor, so it cannot be differentiated. "
                "Keep non-tensor values in arguments that argnums does not name (or in keyword "
                "arguments, or in the module's static fields)."
            )
            raise TypeError(f"{where}: {fmt_path(p, f'args[{i}]')} {why}")


def _split_aux(where: str, out: Any, has_aux: bool | None) -> tuple[Any, Any]:
    """``(value, aux)`` of what a differentiated function returned: with ``has_aux`` a
    pair (checked); without, ``(out, None)``; ``None`` (``fd.train_step``'s loss_fn)
    takes a pair when it is one, else ``(out, {})``."""
    if has_aux is None:
        return (out[0], out[1]) if isinstance(out, tuple) and len(out) == 2 else (out, {})
    if not has_aux:
        return out, None
    if not isinstance(out, tuple) or len(out) != 2:
        raise TypeError(
            f"{where}: has_aux=True, so the function must return a pair (output, aux); it "
            f"returned a {type(out).__name__}"
            + (f" of {len(out)}" if isinstance(out, tuple) else "")
            + ". Return (loss, aux), or set has_aux=False."
        )
    return out


def _check_scalar(where: str, value: Any) -> None:
    if isinstance(value, TensorDict):
        raise TypeError(
            f"{where}: the function returned a TensorDict (batch_size "
            f"{list(value.batch_size)}, keys {list(value.keys())}) but grad needs a scalar "
            "tensor (the loss). Reduce it to one number, e.g. return out['loss'].mean() or "
            "sum(v.sum() for v in out.values(True, True)); to keep the TensorDict alongside, "
            "return (loss, out) with has_aux=True. For the derivative of every entry use "
            "fd.jacrev or fd.vjp."
        )
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"{where}: the function returned a {type(value).__name__} but grad needs a scalar "
            "tensor (the loss). Return a 0-dim tensor; with extra outputs return (loss, aux) "
            "and set has_aux=True."
        )
    if value.dim() != 0:
        raise ValueError(
            f"{where}: the function returned a tensor of shape {list(value.shape)}, but grad "
            "needs a scalar (shape []). Reduce it (.sum() or .mean()); for per-example "
            "gradients map over the batch: fd.vmap(fd.grad(loss), in_dims=(None, 0))(params, "
            "td); for every element's derivative use fd.jacrev or fd.vjp."
        )
    if not (value.is_floating_point() or value.is_complex()):
        raise TypeError(
            f"{where}: the function returned a {value.dtype} tensor; grad needs a floating "
            "scalar (did an argmax or a comparison end up as the loss?)."
        )


def _check_tensor_outputs(where: str, out: Any, root: str = "output") -> None:
    paths, leaves, _ = _paths(out)
    for p, leaf in zip(paths, leaves):
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(
                f"{where}: {fmt_path(p, root)} is a {type(leaf).__name__}; the function must "
                "return only tensors (in tuples, dicts or TensorDicts). Return other values as "
                "aux with has_aux=True."
            )


def _check_like(where: str, got: Any, like: Any, what: str, like_what: str) -> None:
    """``got`` (tangents, cotangents) must have the structure and shapes of ``like``."""
    gp, gl, gs = _paths(got)
    lp, ll, ls = _paths(like)
    if gs != ls:
        g_keys, l_keys = {fmt_path(p, "") for p in gp}, {fmt_path(p, "") for p in lp}
        only_g, only_l = sorted(g_keys - l_keys), sorted(l_keys - g_keys)
        raise ValueError(
            f"{where}: the {what} do not have the structure of the {like_what}: only in the "
            f"{what}: {only_g or '(none)'}; only in the {like_what}: {only_l or '(none)'}"
            + ("" if only_g or only_l else f" (containers differ: {gs} vs {ls})")
            + f". Build them from the {like_what}, e.g. with td.apply(torch.ones_like)."
        )
    for p, g, v in zip(gp, gl, ll):
        if isinstance(v, torch.Tensor) and (
            not isinstance(g, torch.Tensor) or g.shape != v.shape or g.dtype != v.dtype
        ):
            got_s = (
                f"shape {list(g.shape)} and dtype {g.dtype}"
                if isinstance(g, torch.Tensor)
                else f"a {type(g).__name__}"
            )
            raise ValueError(
                f"{where}: {fmt_path(p, what)} has {got_s} but {fmt_path(p, like_what)} has "
                f"shape {list(v.shape)} and dtype {v.dtype}; they must match."
            )


# ------------------------------------------------------------------ grad
def _grad_impl(f: Callable[..., Any], argnums: Argnums, has_aux: bool, where_name: str):
    name = _name(f)
    where = f"fd.{where_name}({name})"

    def checked(*args: Any, **kwargs: Any) -> Any:
        out = f(*args, **kwargs)
        value, _ = _split_aux(where, out, has_aux)
        _check_scalar(where, value)
        return out

    def run(*args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        nums = _argnums(where, argnums, len(args))
        # torch.func walks its argument trees ~5 times (wrap, mark, flatten, unflatten,
        # unwrap): give it the flat leaves of what is differentiated instead, and
        # rebuild the trees once inside and once for the gradients
        leaves, spec = torch_pytree.tree_flatten(tuple(args[i] for i in nums))
        if not all(map(_differentiable, leaves)):
            _check_diff_inputs(where, args, nums)  # raises, naming the path
        if not leaves:  # nothing to differentiate: torch's own call gives the empty trees
            g, out = torch.func.grad_and_value(checked, argnums=argnums, has_aux=has_aux)(
                *args, **kwargs
            )
        else:
            seen: list[Any] = []

            def flat(*xs: Any) -> Any:
                full = list(args)
                for i, v in zip(nums, torch_pytree.tree_unflatten(list(xs), spec)):
                    full[i] = v
                    seen.append((v, args[i]))
                return checked(*full, **kwargs)

            nl = tuple(range(len(leaves)))
            g, out = torch.func.grad_and_value(flat, argnums=nl, has_aux=has_aux)(*leaves)
            if not is_dynamo_compiling():  # the modules checked the rebuilt params: keep
                for inner, given in seen:  # their marks (as loss_and_grad does)
                    if type(inner) is TensorDict and type(given) is TensorDict:
                        keep_marks(inner, given)
            g = torch_pytree.tree_unflatten(list(g), spec)
            g = g if isinstance(argnums, tuple) else g[0]
        value, aux = out if has_aux else (out, None)
        return g, value, aux

    return run


# The types: the gradient of argument 0 has its type (a TensorDict for params); other
# argnums or a has_aux that is not a literal give Callable[same params, Any].
@overload
def grad(
    f: Callable[Concatenate[_T, _P], Any], argnums: Literal[0] = 0, has_aux: Literal[False] = False
) -> Callable[Concatenate[_T, _P], _T]: ...
@overload
def grad(
    f: Callable[Concatenate[_T, _P], tuple[Any, _A]],
    argnums: Literal[0] = 0,
    *,
    has_aux: Literal[True],
) -> Callable[Concatenate[_T, _P], tuple[_T, _A]]: ...
@overload
def grad(
    f: Callable[Concatenate[_T, _P], tuple[Any, _A]], argnums: Literal[0], has_aux: Literal[True]
) -> Callable[Concatenate[_T, _P], tuple[_T, _A]]: ...
@overload
def grad(
    f: Callable[_P, Any], argnums: Argnums = 0, has_aux: bool = False
) -> Callable[_P, Any]: ...


def grad(f: Callable[..., Any], argnums: Argnums = 0, has_aux: bool = False) -> Callable[..., Any]:
    """The gradient of a scalar function, shaped like its ``argnums`` arguments.

    Args:
        f: returns a scalar tensor (or ``(scalar, aux)`` with ``has_aux``).
        argnums: the positional argument(s) to differentiate; each may be a
            pytree (a TensorDict of params, a tuple, a dict).
        has_aux: ``f`` returns ``(loss, aux)``; the result is ``(grads, aux)``.

    Returns:
        A function returning the gradients: a TensorDict for a TensorDict
        argument (same keys and batch size), a tuple for tuple ``argnums``.

    Raises:
        TypeError: ``f`` returns a TensorDict or a non-tensor (use a reduction,
            ``has_aux`` or ``fd.jacrev``), an input to differentiate is not a
            floating tensor (names the path), or ``has_aux`` output is not a pair.
        ValueError: ``f`` returns a non-scalar tensor (names its shape), or
            ``argnums`` names a missing argument.

    Example:
        >>> grads = fd.grad(lambda p, td: m(p, td)["y"].pow(2).mean())(params, td)
        >>> grads.keys(True, True) == params.keys(True, True)
        True
    """
    jitted = derived(f, ("grad", argnums, has_aux), lambda g: grad(g, argnums, has_aux))
    if jitted is not None:  # fd.grad(fd.jit(f)) is fd.jit(fd.grad(f)) (_compose)
        return jitted
    run = _grad_impl(f, argnums, has_aux, "grad")

    @functools.wraps(f)
    def grad_f(*args: Any, **kwargs: Any) -> Any:
        g, _, aux = run(*args, **kwargs)
        return (g, aux) if has_aux else g

    return grad_f


@overload
def value_and_grad(
    f: Callable[Concatenate[_T, _P], _R], argnums: Literal[0] = 0, has_aux: Literal[False] = False
) -> Callable[Concatenate[_T, _P], tuple[_R, _T]]: ...
@overload
def value_and_grad(
    f: Callable[Concatenate[_T, _P], tuple[_R, _A]],
    argnums: Literal[0] = 0,
    *,
    has_aux: Literal[True],
) -> Callable[Concatenate[_T, _P], tuple[tuple[_R, _A], _T]]: ...
@overload
def value_and_grad(
    f: Callable[Concatenate[_T, _P], tuple[_R, _A]], argnums: Literal[0], has_aux: Literal[True]
) -> Callable[Concatenate[_T, _P], tuple[tuple[_R, _A], _T]]: ...
@overload
def value_and_grad(
    f: Callable[_P, Any], argnums: Argnums = 0, has_aux: bool = False
) -> Callable[_P, Any]: ...


def value_and_grad(
    f: Callable[..., Any], argnums: Argnums = 0, has_aux: bool = False
) -> Callable[..., Any]:
    """``f``'s value and gradient in one pass, in JAX's order: ``(value, grads)``.

    With ``has_aux`` the result is ``((value, aux), grads)``, as in JAX (note:
    ``torch.func.grad_and_value`` returns them the other way round).

    Args, Raises: as ``fd.grad``.

    Example:
        >>> loss, grads = fd.value_and_grad(loss_fn)(params, td)
    """
    key = ("value_and_grad", argnums, has_aux)
    jitted = derived(f, key, lambda g: value_and_grad(g, argnums, has_aux))
    if jitted is not None:
        return jitted
    run = _grad_impl(f, argnums, has_aux, "value_and_grad")

    @functools.wraps(f)
    def value_and_grad_f(*args: Any, **kwargs: Any) -> Any:
        g, value, aux = run(*args, **kwargs)
        return ((value, aux), g) if has_aux else (value, g)

    return value_and_grad_f


# ------------------------------------------------------------------ fd.train_step's
def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {list(x.shape)}"
    return f"a {type(x).__name__}"


def _check_loss(where: str, loss: Any) -> None:
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        raise TypeError(
            f"{where}: loss_fn(params, batch, key) must return a scalar tensor (the loss) or a "
            f"pair (loss, aux); got {_describe(loss)}. Reduce the loss to a scalar, e.g. "
            ".mean(); under vmap, return each member's scalar."
        )


def loss_and_grad(
    where: str, loss_fn: Callable[..., Any], params: TensorDict, *args: Any
) -> tuple[torch.Tensor, Any, TensorDict]:
    """``loss, aux, grads`` of ``loss_fn(params, *args)`` with respect to the TensorDict
    ``params``: ``fd.train_step``'s gradient (its loss_fn returns the scalar loss or
    ``(loss, aux)``).

    Under ``torch.compile`` and ``torch.func`` transforms this is
    ``torch.func.grad_and_value``. On plain eager tensors it is the same
    computation through ``torch.autograd.grad`` on detached copies of the leaves
    (views, no data copied), which skips functorch's per-op wrapping overhead.
    ``params`` is not modified either way; on the eager path it receives the
    params-check marks the modules left on the copy (a cache slot, as after a
    module call), so TensorDicts built from it later skip the check.

    Example:
        >>> loss, aux, grads = loss_and_grad("fd.train_step(f, ...)", f, params, batch, key)
    """
    leaves = flat_leaves(params)

    def f(p: TensorDict, *a: Any) -> tuple[torch.Tensor, Any]:
        loss, aux = _split_aux(where, loss_fn(p, *a), None)
        _check_loss(where, loss)
        return loss, aux

    if not plain(leaves):
        grads, (loss, aux) = torch.func.grad_and_value(f, has_aux=True)(params, *args)
        return loss, aux, grads
    with torch.enable_grad():
        inputs = [x.detach().requires_grad_() for x in leaves]
        seen = unflatten_like(params, inputs)
        loss, aux = f(seen, *args)
        if not loss.requires_grad:  # the loss does not depend on params
            gs = [None] * len(inputs)
        else:
            gs = torch.autograd.grad(loss, inputs, allow_unused=True)  # type: ignore[assignment]
    # the modules checked ``seen`` against their layouts; ``params`` has the same one, so
    # its next copies (the next step's params, built from these) skip the check: a write
    # to the params-check cache only (functd/_td/_marks.py), no value changes
    keep_marks(seen, params)
    gs = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, gs)]  # type: ignore[misc]
    if isinstance(aux, torch.Tensor):
        aux = aux.detach()
    elif not (type(aux) is dict and not aux):  # (train_step's loss without aux: {})
        aux = tree.map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, aux)
    return loss.detach(), aux, unflatten_like(params, gs)  # type: ignore[arg-type]


# ------------------------------------------------------------------ Jacobians
def _rebuild(template: Any, leaves: Any, prefix: torch.Size, where: str) -> Any:
    """Rebuild ``template``'s structure around ``leaves`` (in torch pytree order);
    each TensorDict gets the batch size ``[*prefix, *its batch size]``."""
    if isinstance(template, TensorDict):
        built = {}
        for k in spec_of(template).keys:  # the leaf order (sorted keys)
            v = _rebuild(template._data[k], leaves, prefix, where)
            if not isinstance(v, torch.Tensor | TensorDict):
                raise TypeError(
                    f"{where}: the function returns a TensorDict, so its Jacobian is a "
                    "TensorDict whose entries hold the derivatives with respect to the inputs; "
                    f"here those are a {type(v).__name__}, which cannot be a TensorDict entry. "
                    "Differentiate with respect to one argument (argnums=int) that is a tensor "
                    "or a TensorDict, or return a tuple or dict instead of a TensorDict."
                )
            built[k] = v
        bs = torch.Size((*prefix, *template._batch_size))
        return from_parts({k: built[k] for k in template._data}, bs)
    if isinstance(template, torch.Tensor):
        return next(leaves)
    if template is None:
        return None
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return type(template)(*(_rebuild(v, leaves, prefix, where) for v in template))
    if isinstance(template, tuple | list):
        return type(template)(_rebuild(v, leaves, prefix, where) for v in template)
    if isinstance(template, dict):
        return type(template)((k, _rebuild(v, leaves, prefix, where)) for k, v in template.items())
    return next(leaves)


def _jacobian(
    kind: str, f: Callable[..., Any], argnums: Argnums, has_aux: bool, **opts: Any
) -> Callable[..., Any]:
    name = _name(f)
    where = f"fd.{kind}({name})"
    transform = torch.func.jacrev if kind == "jacrev" else torch.func.jacfwd

    @functools.wraps(f)
    def jac_f(*args: Any, **kwargs: Any) -> Any:
        nums = _argnums(where, argnums, len(args))
        _check_diff_inputs(where, args, nums)
        diff = tuple(args[i] for i in nums)
        in_leaves, in_spec = torch_pytree.tree_flatten(diff)
        box: list[Any] = []

        def flat_f(*leaves: Any) -> Any:
            full = list(args)
            for i, v in zip(nums, torch_pytree.tree_unflatten(list(leaves), in_spec)):
                full[i] = v
            out, aux = _split_aux(where, f(*full, **kwargs), has_aux)
            _check_tensor_outputs(where, out)
            box.append(out)  # the structure and batch sizes of the output
            flat = tuple(torch_pytree.tree_leaves(out))
            return (flat, aux) if has_aux else flat

        res = transform(flat_f, argnums=tuple(range(len(in_leaves))), has_aux=has_aux, **opts)(
            *in_leaves
        )
        jac, aux = res if has_aux else (res, None)
        in_tmpl = diff if isinstance(argnums, tuple) else diff[0]
        per_out = []
        for row in jac:  # one row per output leaf: d out / d each input leaf
            lead = row[0].shape[: row[0].ndim - in_leaves[0].ndim] if row else torch.Size()
            per_out.append(_rebuild(in_tmpl, iter(row), lead, where))
        result = _rebuild(box[-1], iter(per_out), torch.Size(), where)
        return (result, aux) if has_aux else result

    return jac_f


def jacrev(
    f: Callable[..., Any],
    argnums: Argnums = 0,
    *,
    has_aux: bool = False,
    chunk_size: int | None = None,
) -> Callable[..., Any]:
    """The Jacobian of ``f`` by reverse mode (one vjp per output element, vmapped).

    The result has the structure of the outputs; each output leaf is replaced
    by a tree of the inputs whose leaves have shape
    ``[*output_leaf_shape, *input_leaf_shape]`` (TensorDicts get batch size
    ``[*output_leaf_shape, *input_batch_size]``, so they stay valid).

    Args:
        f: returns tensors (in tuples, dicts or TensorDicts).
        argnums: the argument(s) to differentiate.
        has_aux: ``f`` returns ``(output, aux)``; the result is ``(jac, aux)``.
        chunk_size: as ``torch.func.jacrev``.

    Raises:
        TypeError: an input is not a floating tensor, the function returns
            a non-tensor, or a TensorDict output meets tuple ``argnums``.

    Example:
        >>> j = fd.jacrev(lambda x: fd.TensorDict({"a": x * 2}, [3]))(torch.ones(3))
        >>> j["a"].shape
        torch.Size([3, 3])
    """
    key = ("jacrev", argnums, has_aux, chunk_size)
    jitted = derived(f, key, lambda g: jacrev(g, argnums, has_aux=has_aux, chunk_size=chunk_size))
    if jitted is not None:
        return jitted
    opts = {} if chunk_size is None else {"chunk_size": chunk_size}
    return _jacobian("jacrev", f, argnums, has_aux, **opts)


def jacfwd(
    f: Callable[..., Any], argnums: Argnums = 0, has_aux: bool = False, *, randomness: str = "error"
) -> Callable[..., Any]:
    """The Jacobian of ``f`` by forward mode (one jvp per input element, vmapped).

    Same result layout and errors as ``fd.jacrev``.

    Example:
        >>> fd.jacfwd(torch.sin)(torch.zeros(2))
        tensor([[1., 0.],
                [0., 1.]])
    """
    key = ("jacfwd", argnums, has_aux, randomness)
    jitted = derived(f, key, lambda g: jacfwd(g, argnums, has_aux, randomness=randomness))
    if jitted is not None:
        return jitted
    return _jacobian("jacfwd", f, argnums, has_aux, randomness=randomness)


def hessian(f: Callable[..., Any], argnums: Argnums = 0) -> Callable[..., Any]:
    """The Hessian of a scalar ``f``: ``fd.jacfwd(fd.jacrev(f))``.

    For a TensorDict argument the result is a TensorDict of TensorDicts:
    ``h[k1][k2]`` has shape ``[*shape(k1), *shape(k2)]``.

    Example:
        >>> h = fd.hessian(lambda t: (t["x"] ** 3).sum())(td)
        >>> h["x"]["x"]  # diag(6 x)
    """
    jitted = derived(f, ("hessian", argnums), lambda g: hessian(g, argnums))
    if jitted is not None:
        return jitted
    name = _name(f)

    def scalar_f(*args: Any, **kwargs: Any) -> Any:
        out = f(*args, **kwargs)
        _check_scalar(f"fd.hessian({name})", out)
        return out

    h = jacfwd(jacrev(scalar_f, argnums), argnums)
    return functools.wraps(f)(lambda *a, **k: h(*a, **k))


def jvp(
    f: Callable[..., Any],
    primals: tuple[Any, ...],
    tangents: tuple[Any, ...],
    *,
    has_aux: bool = False,
) -> tuple[Any, ...]:
    """Forward-mode product: ``(f(*primals), J @ tangents)``.

    Args:
        f: returns tensors (in tuples, dicts or TensorDicts).
        primals: a tuple of the positional arguments.
        tangents: a tuple with the structure, shapes and dtypes of ``primals``.
        has_aux: ``f`` returns ``(output, aux)``; the result is
            ``(output, tangent_out, aux)``.

    Raises:
        ValueError: the tangents do not match the primals (names the path).
        TypeError: ``primals``/``tangents`` are not tuples, or an input is not a
            floating tensor.

    Example:
        >>> out, t_out = fd.jvp(lambda t: t.apply(torch.sin), (td,), (td.apply(torch.ones_like),))
    """
    where = f"fd.jvp({_name(f)})"
    for what, v in (("primals", primals), ("tangents", tangents)):
        if not isinstance(v, tuple):
            raise TypeError(
                f"{where}: {what} must be a tuple of the arguments, e.g. (td,); got a "
                f"{type(v).__name__}."
            )
    _check_diff_inputs(where, primals, tuple(range(len(primals))))
    _check_like(where, tangents, primals, "tangents", "primals")
    if is_jitted(f):  # fd.jvp(fd.jit(f), ...) runs fd.jit of fd.jvp(f, ...) (_compose)

        def build(g: Callable[..., Any]) -> Callable[..., Any]:
            return lambda p, t: jvp(g, p, t, has_aux=has_aux)

        return derived(f, ("jvp", has_aux), build, static=False)(primals, tangents)

    def checked(*args: Any) -> Any:
        out = f(*args)
        value, _ = _split_aux(where, out, has_aux)
        _check_tensor_outputs(where, value)
        return out

    return torch.func.jvp(checked, primals, tangents, has_aux=has_aux)


def vjp(f: Callable[..., Any], *primals: Any, has_aux: bool = False) -> tuple[Any, ...]:
    """Reverse-mode product: ``(f(*primals), vjp_fn)``; ``vjp_fn(cotangents)`` returns a
    tuple of the gradients of each primal, shaped like it.

    Args:
        f: returns tensors (in tuples, dicts or TensorDicts).
        primals: the positional arguments.
        has_aux: ``f`` returns ``(output, aux)``; the result is
            ``(output, vjp_fn, aux)``.

    Raises:
        ValueError: (from ``vjp_fn``) the cotangents do not have the structure,
            shapes and dtypes of the output (names the path).

    Example:
        >>> out, vjp_fn = fd.vjp(lambda t: t.apply(torch.sin), td)
        >>> (g,) = vjp_fn(out.apply(torch.ones_like))   # g like td: cos(td)
    """
    where = f"fd.vjp({_name(f)})"
    _check_diff_inputs(where, primals, tuple(range(len(primals))))
    if is_jitted(f):
        return _vjp_jitted(where, f, primals, has_aux)

    def checked(*args: Any) -> Any:
        out = f(*args)
        value, _ = _split_aux(where, out, has_aux)
        _check_tensor_outputs(where, value)
        return out

    res = torch.func.vjp(checked, *primals, has_aux=has_aux)
    out, fn = res[0], res[1]

    def vjp_fn(cotangents: Any) -> tuple[Any, ...]:
        _check_like(where, cotangents, out, "cotangents", "output")
        return fn(cotangents)

    return (out, vjp_fn, res[2]) if has_aux else (out, vjp_fn)  # type: ignore[misc]


def _vjp_jitted(where: str, f: Any, primals: tuple[Any, ...], has_aux: bool) -> tuple[Any, ...]:
    """``fd.vjp`` of a jitted function: the forward is ``f``'s compiled call, and
    ``vjp_fn`` is the compiled ``fd.vjp(inner, *primals)[1](cotangents)`` (it runs the
    forward again inside, as a compiled backward without saved activations would)."""
    res = f(*primals)
    out, aux = _split_aux(where, res, has_aux)
    _check_tensor_outputs(where, out)

    def build(g: Callable[..., Any]) -> Callable[..., Any]:
        return lambda p, ct: vjp(g, *p, has_aux=has_aux)[1](ct)

    backward = derived(f, ("vjp", has_aux), build, static=False)

    def vjp_fn(cotangents: Any) -> tuple[Any, ...]:
        _check_like(where, cotangents, out, "cotangents", "output")
        return backward(primals, cotangents)

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)
