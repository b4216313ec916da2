"""functd: immutable TensorDict pytrees and pure modules for PyTorch.

Example:
    >>> import torch, functd as fd
    >>> td = fd.TensorDict({"x": torch.zeros(5, 3)}, batch_size=[5])
    >>> td.set("y", torch.ones(5)).keys()
    ('x', 'y')
"""

from . import _tree
from . import distributed as distributed
from . import nn as nn
from . import optim as optim
from . import random as random
from . import testing as testing
from ._autodiff import grad as grad
from ._autodiff import hessian as hessian
from ._autodiff import jacfwd as jacfwd
from ._autodiff import jacrev as jacrev
from ._autodiff import jvp as jvp
from ._autodiff import value_and_grad as value_and_grad
from ._autodiff import vjp as vjp
from ._cuda_graph import CudaGraphWarning as CudaGraphWarning
from ._cuda_graph import cuda_graph as cuda_graph
from ._distributions import InteractionType as InteractionType
from ._distributions import set_interaction_type as set_interaction_type
from ._io import load as load
from ._io import save as save
from ._module import Module as Module
from ._param_extractor import NormalParamExtractor as NormalParamExtractor
from ._params import from_module as from_module
from ._params import to_module as to_module
from ._probabilistic import CompositeDistribution as CompositeDistribution
from ._probabilistic import Probabilistic as Probabilistic
from ._probabilistic import ProbabilisticSequential as ProbabilisticSequential
from ._sequential import Sequential as Sequential
from ._shape import cat as cat
from ._shape import stack as stack
from ._shape import unbind as unbind
from ._shape import unstack as unstack
from ._td import TensorDict as TensorDict
from ._train import fit as fit
from ._train import train_step as train_step
from ._tree import tree as tree
from ._vmap import TransformError as TransformError
from ._vmap import vmap as vmap

__version__ = "0.1.0"

del _tree
