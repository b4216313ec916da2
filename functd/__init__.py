"""functd: immutable TensorDict pytrees and pure modules for PyTorch.

Example:
    >>> import torch, functd as fd
    >>> td = fd.TensorDict({"x": torch.zeros(5, 3)}, batch_size=[5])
    >>> td.set("y", torch.ones(5)).keys()
    ('x', 'y')
"""

# first: an unsupported torch gets one clear ImportError before anything else meets it
from . import _torch
from . import distributed as distributed
from . import nn as nn
from . import optim as optim
from . import random as random
from . import testing as testing
from ._modules._distributions import InteractionType as InteractionType
from ._modules._distributions import set_interaction_type as set_interaction_type
from ._modules._module import Module as Module
from ._modules._params import from_module as from_module
from ._modules._params import to_module as to_module
from ._modules._prob_sequential import ProbabilisticSequential as ProbabilisticSequential
from ._modules._probabilistic import CompositeDistribution as CompositeDistribution
from ._modules._probabilistic import Probabilistic as Probabilistic
from ._modules._sequential import Sequential as Sequential
from ._modules._trainable import trainable as trainable
from ._td import TensorDict as TensorDict
from ._td._io import load as load
from ._td._io import save as save
from ._td._partition import combine as combine
from ._td._partition import partition as partition
from ._td._shape import cat as cat
from ._td._shape import stack as stack
from ._td._shape import unbind as unbind
from ._td._shape import unstack as unstack
from ._td._tree import tree as tree
from ._train import TrainStep as TrainStep
from ._train import fit as fit
from ._train import train_step as train_step
from ._transforms._autodiff import grad as grad
from ._transforms._autodiff import hessian as hessian
from ._transforms._autodiff import jacfwd as jacfwd
from ._transforms._autodiff import jacrev as jacrev
from ._transforms._autodiff import jvp as jvp
from ._transforms._autodiff import value_and_grad as value_and_grad
from ._transforms._autodiff import vjp as vjp
from ._transforms._axes import axis_size as axis_size
from ._transforms._axes import pmean as pmean
from ._transforms._axes import psum as psum
from ._transforms._cuda_graph import CudaGraphWarning as CudaGraphWarning
from ._transforms._cuda_graph import cuda_graph as cuda_graph
from ._transforms._jit import JitWarning as JitWarning
from ._transforms._jit import jit as jit
from ._transforms._jit_artifact import load_compiled as load_compiled
from ._transforms._loops import LoopWarning as LoopWarning
from ._transforms._loops import fori_loop as fori_loop
from ._transforms._loops import scan as scan
from ._transforms._vmap import TransformError as TransformError
from ._transforms._vmap import vmap as vmap
from ._transforms._while import while_loop as while_loop
from ._version import __version__ as __version__
from .nn._param_extractor import NormalParamExtractor as NormalParamExtractor
