"""The TensorDict layer: the frozen container, its shape ops, repr, pytree and files.

Everything here imports only ``functd._errors`` and ``functd.random``'s kernels below
it; modules, transforms and optimizers reach the container through this package.

Example:
    >>> from functd._td import TensorDict
    >>> TensorDict({"x": torch.zeros(2)}, batch_size=[2]).batch_size
    torch.Size([2])
"""

from ._key import _check_key as _check_key
from ._key import plain_str as plain_str
from ._tensordict import Key as Key
from ._tensordict import TensorDict as TensorDict
from ._tensordict import _alloc as _alloc
from ._tensordict import _is_dynamo as _is_dynamo
from ._tensordict import _new as _new
from ._tensordict import _set_bs as _set_bs
from ._tensordict import _set_data as _set_data
from ._tensordict import _set_path as _set_path
from ._tensordict import _set_spec as _set_spec
