"""The samplers of functd.random, one small case each, shared by the tests of the
pure path (test_random.py: laws) and of the fused kernel (test_random_fused.py:
bitwise equal to the pure path).

``SAMPLERS[name] = f(key, shape)``; ``FUSED_EXTRA`` adds the dtypes and argument
forms that take separate branches of the fused kernel.
"""

from __future__ import annotations

import torch

import functd.random as fr

SAMPLERS = {
    "bits": lambda k, s: fr.bits(k, s),
    "bits64": lambda k, s: fr.bits(k, s, torch.int64),
    "uniform": lambda k, s: fr.uniform(k, s),
    "uniform_range": lambda k, s: fr.uniform(k, s, minval=-2.0, maxval=3.0),
    "uniform_bf16": lambda k, s: fr.uniform(k, s, torch.bfloat16),
    "normal": lambda k, s: fr.normal(k, s),
    "gumbel": lambda k, s: fr.gumbel(k, s),
    "exponential": lambda k, s: fr.exponential(k, s),
    "truncated_normal": lambda k, s: fr.truncated_normal(k, -1.0, 2.0, s),
    "bernoulli": lambda k, s: fr.bernoulli(k, 0.3, s),
    "categorical": lambda k, s: fr.categorical(k, torch.tensor([0.0, 1.0, -1.0]), shape=s),
    "randint": lambda k, s: fr.randint(k, s, -5, 2**40),
    "randint8": lambda k, s: fr.randint(k, s, -5, 100, torch.int8),
    "permutation": lambda k, s: fr.permutation(k, sum(s) + 1),
    "split": lambda k, s: fr.split(k, sum(s) + 1),
    "fold_in": lambda k, s: fr.fold_in(k, sum(s)),
}

FUSED_EXTRA = {
    "bits_u8": lambda k, s: fr.bits(k, s, torch.uint8),
    "bits_i16": lambda k, s: fr.bits(k, s, torch.int16),
    "bits_u64": lambda k, s: fr.bits(k, s, torch.uint64),
    "uniform64": lambda k, s: fr.uniform(k, s, torch.float64),
    "uniform_f16": lambda k, s: fr.uniform(k, s, torch.float16),
    "normal64": lambda k, s: fr.normal(k, s, torch.float64),
    "normal_f16": lambda k, s: fr.normal(k, s, torch.float16),
    "gumbel64": lambda k, s: fr.gumbel(k, s, torch.float64),
    "exponential64": lambda k, s: fr.exponential(k, s, torch.float64),
    "split_shape": lambda k, s: fr.split(k, s),
    "fold_in_large": lambda k, s: fr.fold_in(k, (sum(s) * 977 + 2**32 - 30) % 2**32),
}
