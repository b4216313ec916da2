"""functd: immutable TensorDict pytrees and pure modules for PyTorch.

Example:
    >>> import torch, functd as fd
    >>> td = fd.TensorDict({"x": torch.zeros(5, 3)}, batch_size=[5])
    >>> td.set("y", torch.ones(5)).keys()
    ('x', 'y')
"""

from . import _tree
from . import nn as nn
from . import optim as optim
from . import random as random
from . import testing as testing
from ._io import load as load
from ._io import save as save
from ._module import Module as Module
from ._params import from_module as from_module
from ._params import to_module as to_module
from ._sequential import Sequential as Sequential
from ._shape import cat as cat
from ._shape import stack as stack
from ._shape import unbind as unbind
from ._td import TensorDict as TensorDict
from ._train import fit as fit
from ._train import train_step as train_step
from ._tree import tree as tree

__version__ = "0.1.0"

del _tree
