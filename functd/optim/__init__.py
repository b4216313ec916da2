"""functd.optim: pure, optax-shaped optimizers with torch.optim's formulas.

An optimizer is a :class:`GradientTransformation` ``(init, update)``; its state
is a TensorDict (per-parameter statistics shaped like the params, and a scalar
``count`` tensor), so the state is a pytree that ``fd.save`` stores and
``vmap`` maps over. Nothing given is modified; every step compiles with
``torch.compile(fullgraph=True)`` and runs under ``torch.func.vmap``.

NaN or inf gradients flow through as in torch.optim (the state and then the
params become NaN); wrap the optimizer with :func:`skip_nonfinite` to skip
such steps instead.

Example:
    >>> opt = fd.optim.adam(1e-3)
    >>> state = opt.init(params)
    >>> updates, state = opt.update(grads, state, params)
    >>> params = fd.optim.apply_updates(params, updates)
"""

from ._accumulation import MultiSteps as MultiSteps
from ._accumulation import apply_every as apply_every
from ._accumulation import skip_large_updates as skip_large_updates
from ._accumulation import skip_not_finite as skip_not_finite
from ._alias import adagrad as adagrad
from ._alias import adam as adam
from ._alias import adamw as adamw
from ._alias import lion as lion
from ._alias import rmsprop as rmsprop
from ._alias import sgd as sgd
from ._base import GradientTransformation as GradientTransformation
from ._base import Partial as Partial
from ._base import apply_updates as apply_updates
from ._base import chain as chain
from ._base import identity as identity
from ._combine import named_chain as named_chain
from ._constrain import zero_nans as zero_nans
from ._ema import ema as ema
from ._inject import inject_hyperparams as inject_hyperparams
from ._map_params import tree_map_params as tree_map_params
from ._masking import masked as masked
from ._masking import multi_transform as multi_transform
from ._masking import set_to_zero as set_to_zero
from ._schedules import constant as constant
from ._schedules import cosine_decay as cosine_decay
from ._schedules import exponential_decay as exponential_decay
from ._schedules import linear as linear
from ._schedules import warmup_cosine_decay as warmup_cosine_decay
from ._targets import incremental_update as incremental_update
from ._targets import periodic_update as periodic_update
from ._transforms import add_decayed_weights as add_decayed_weights
from ._transforms import clip as clip
from ._transforms import clip_by_global_norm as clip_by_global_norm
from ._transforms import scale as scale
from ._transforms import scale_by_adam as scale_by_adam
from ._transforms import scale_by_learning_rate as scale_by_learning_rate
from ._transforms import scale_by_lion as scale_by_lion
from ._transforms import scale_by_rms as scale_by_rms
from ._transforms import scale_by_schedule as scale_by_schedule
from ._transforms import trace as trace
from ._wrappers import skip_nonfinite as skip_nonfinite

__all__ = [
    "GradientTransformation",
    "MultiSteps",
    "Partial",
    "adagrad",
    "adam",
    "adamw",
    "add_decayed_weights",
    "apply_every",
    "apply_updates",
    "chain",
    "clip",
    "clip_by_global_norm",
    "constant",
    "cosine_decay",
    "ema",
    "exponential_decay",
    "identity",
    "incremental_update",
    "inject_hyperparams",
    "linear",
    "lion",
    "masked",
    "multi_transform",
    "named_chain",
    "periodic_update",
    "rmsprop",
    "scale",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_lion",
    "scale_by_rms",
    "scale_by_schedule",
    "set_to_zero",
    "sgd",
    "skip_large_updates",
    "skip_nonfinite",
    "skip_not_finite",
    "trace",
    "tree_map_params",
    "warmup_cosine_decay",
    "zero_nans",
]
