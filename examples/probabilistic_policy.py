"""The tensordict tutorial's GRU policy ("Working with distributions"), as pure functions.

A GRU cell writes a hidden state, NormalParamExtractor splits it into "loc" and
"scale", and a Probabilistic head writes "action" from a Normal and its
log-probability under "action_log_prob". The differences from tensordict: the
parameters are an explicit TensorDict, a call returns a new TensorDict, and
randomness comes from an explicit key, so 8 keys under vmap give 8 actions,
and the log-probability is a plain function of the parameters to differentiate.

Run: python examples/probabilistic_policy.py (also part of `make demo`).
"""

from __future__ import annotations

import torch
from torch import distributions as dist
from torch import nn

import functd as fd


def build_policy() -> fd.ProbabilisticSequential:
    return fd.ProbabilisticSequential(
        fd.Module(nn.GRUCell(4, 8), in_keys=["input", "hidden"], out_keys=["hidden"]),
        fd.Module(fd.NormalParamExtractor(), in_keys=["hidden"], out_keys=["loc", "scale"]),
        fd.Probabilistic(
            in_keys=["loc", "scale"],
            out_keys=["action"],
            distribution_class=dist.Normal,
            return_log_prob=True,
        ),
    )


def main() -> None:
    policy = build_policy()
    params = policy.init(fd.random.key(0))  # or fd.from_module(policy): the GRU's weights
    g = torch.Generator().manual_seed(0)
    td = fd.TensorDict(
        {"input": torch.randn(3, 4, generator=g), "hidden": torch.randn(3, 8, generator=g)}, [3]
    )
    print(f"TensorDict before going through the policy: {td}")

    # Deterministic by default: the action is the mean of the Normal, "loc".
    out = policy(params, td)
    print(f"TensorDict after going through the policy: {out}")
    assert torch.equal(out.get_tensor("action"), out.get_tensor("loc")) and "action" not in td

    # Random: a reparameterised draw loc + eps * scale, eps from the explicit key.
    key = fd.random.key(42)
    out_r = policy(params, td, key=key, interaction=fd.InteractionType.RANDOM)
    assert not torch.equal(out_r.get_tensor("action"), out_r.get_tensor("loc"))
    with fd.set_interaction_type(fd.InteractionType.RANDOM):  # the same, as a default
        assert torch.equal(
            policy(params, td, key=key).get_tensor("action"), out_r.get_tensor("action")
        )
    print("\nrandom action[0]:", out_r["action"][0])

    # 8 keys under vmap: 8 independent actions for the same input (an ensemble of draws).
    keys = fd.random.split(key, 8)
    outs = torch.func.vmap(
        lambda k: policy(params, td, key=k, interaction=fd.InteractionType.RANDOM)
    )(keys)
    first = outs["action"][:, 0, 0]
    assert outs.batch_size == (8, 3) and len(set(first.tolist())) == 8
    print("8 keys -> action[0, 0] of each:", [round(v, 3) for v in first.tolist()])

    # The distribution object, and the log-probability of a stored action.
    print("policy.get_dist(params, td):", policy.get_dist(params, td))
    stored = policy.log_prob(params, out_r.set("hidden", td["hidden"]))
    assert isinstance(stored, torch.Tensor)  # one distribution: a tensor
    assert torch.equal(stored, out_r.get_tensor("action_log_prob"))

    # Gradient of the log-probability of the sampled action w.r.t. the parameters.
    def log_prob(p: fd.TensorDict) -> torch.Tensor:
        out = policy(p, td, key=key, interaction=fd.InteractionType.RANDOM)
        return out.get_tensor("action_log_prob").sum()

    grads = torch.func.grad(log_prob)(params)
    print("grad of sum(log-prob) w.r.t. params:", grads)
    norms = {"/".join(k): round(v.norm().item(), 4) for k, v in grads.items(True, True)}
    print("gradient norms:", norms)


if __name__ == "__main__":
    main()
