"""The TensorDict layer: the frozen container, its shape ops, repr, pytree and files.

Everything here imports only ``functd._errors`` below it; modules, transforms and
optimizers reach the container through this package.

Example:
    >>> from functd._td import TensorDict
    >>> TensorDict({"x": torch.zeros(2)}, batch_size=[2]).batch_size
    torch.Size([2])
"""

from ._key import key_path as key_path
from ._key import plain_str as plain_str
from ._tensordict import EMPTY as EMPTY
from ._tensordict import Key as Key
from ._tensordict import TensorDict as TensorDict
from ._tensordict import from_parts as from_parts
from ._tensordict import is_dynamo_compiling as is_dynamo_compiling
from ._tensordict import new_unchecked as new_unchecked
from ._tensordict import set_path as set_path
from ._tensordict import set_spec_slot as set_spec_slot
