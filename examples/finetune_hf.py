"""Fine-tune a small HF transformers model with functd: frozen embeddings, dropout
driven by keys, and a vmapped ensemble of 4 classification heads.

The model is a tiny random BERT (no download) on a synthetic task: does the
token 7 occur in the sequence? The torch model is wrapped as it is, its inputs
bound by name; `fd.trainable` tells what torch would train (the embeddings are
frozen, the `position_ids`/`token_type_ids` buffers are not parameters), and
`fd.partition` splits them off. Each of the 4 members has its own head and its
own copy of the encoder, its own dropout masks (one key each) and one vmapped
training step trains them all.

The learning rate matters here: the [CLS] position must learn to attend to the
token 7 through two random attention layers, which takes about 40 Adam steps at
1e-2 (at 3e-3, 24 steps learned nothing: loss ln 2, chance accuracy). One torch
thread: the matmuls are tiny, and OpenMP's waits on a shared 2-core machine cost
more than a second thread gives.

Run: `python examples/finetune_hf.py` (QUICK=1: a short run, about 5 s; full:
about 20 s; `make examples`). Needs transformers (`pip install -e ".[models]"`).
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import functd as fd

QUICK = os.environ.get("QUICK", "0") == "1"
MEMBERS, VOCAB, LENGTH, WIDTH = 4, 30, 12, 32
EPOCHS = 5 if QUICK else 30  # 8 steps of 64 examples each
LR = 1e-2


def make_data(key: torch.Tensor, n: int) -> fd.TensorDict:
    """Random token sequences; label 1 when token 7 occurs (half of them)."""
    k_ids, k_label, k_pos = fd.random.split(key, 3)
    ids = fd.random.randint(k_ids, (n, LENGTH), 8, VOCAB)  # no 7 yet
    label = fd.random.bernoulli(k_label, 0.5, (n,))
    pos = fd.random.randint(k_pos, (n,), 1, LENGTH)
    ids[torch.arange(n), pos] = torch.where(label, 7, ids[torch.arange(n), pos])
    ids[:, 0] = 1  # a [CLS]-like first token
    return fd.TensorDict({"ids": ids.long(), "label": label.long()}, [n])


def build_model() -> tuple[fd.Sequential, torch.nn.Module]:
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.BertConfig(  # type: ignore[call-arg]  # attn_implementation: a **kwargs
            vocab_size=VOCAB,
            hidden_size=WIDTH,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=LENGTH,
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
            attn_implementation="eager",
        )  # eager attention: matmuls, which vmap batches (torch's CPU SDPA kernel runs
        # member by member under vmap)
    torch.manual_seed(0)
    bert = transformers.BertModel(config)  # in training mode: dropout on
    bert.embeddings.requires_grad_(False)  # frozen, as one would freeze pretrained embeddings
    body = fd.Module(bert, in_keys={"ids": "input_ids"}, out_keys=["last_hidden_state"])
    pool = fd.Module(lambda h: h[:, 0], ["last_hidden_state"], ["cls"])
    head = fd.Module(nn.Linear(WIDTH, 2), ["cls"], ["logits"])
    return body >> pool >> head, bert


def main() -> dict[str, float]:
    """Train, print the test accuracies; returns the figures the tests check."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _main()
    finally:
        torch.set_num_threads(threads)


def _main() -> dict[str, float]:
    key = fd.random.key(0)
    k_train, k_test, k_heads, k_steps = fd.random.split(key, 4)
    train, test = make_data(k_train, 512), make_data(k_test, 256)
    model, bert = build_model()

    params, held = fd.partition(fd.from_module(model), fd.trainable(model))
    n_held = sum(v.numel() for v in held.values(True, True))
    print(f"trainable: {sum(v.numel() for v in params.values(True, True))} numbers; held out "
          f"(frozen embeddings, buffers): {n_held}")  # fmt: skip

    # 4 members: the same encoder to start from, each its own fresh head ("2": the head)
    head_init = fd.vmap(model.modules[2].init)(fd.random.split(k_heads, MEMBERS))
    ensemble = fd.stack([params] * MEMBERS).set("2", head_init)

    def loss_fn(params: fd.TensorDict, batch: fd.TensorDict, key: torch.Tensor) -> torch.Tensor:
        out = model(fd.combine(params, held), batch, key=key)  # dropout masks from `key`
        return F.cross_entropy(out.get_tensor("logits"), batch.get_tensor("label"))

    opt = fd.optim.adamw(LR, weight_decay=0.01)
    opt_state = fd.vmap(opt.init)(ensemble)
    member_step = fd.vmap(fd.train_step(loss_fn, opt), in_dims=(0, 0, None, 0))

    def step(
        ensemble: fd.TensorDict, opt_state: fd.TensorDict, batch: fd.TensorDict, key: torch.Tensor
    ) -> tuple[fd.TensorDict, fd.TensorDict, fd.TensorDict]:  # one key per member
        return member_step(ensemble, opt_state, batch, fd.random.split(key, MEMBERS))

    def batches(epoch: int) -> list[fd.TensorDict]:
        order = fd.random.permutation(fd.random.fold_in(k_steps, epoch), len(train))
        return [train[order[i : i + 64]] for i in range(0, len(train), 64)]

    ensemble, opt_state, history = fd.fit(
        step, ensemble, opt_state, batches, k_steps, epochs=EPOCHS, print_every=max(1, EPOCHS // 5)
    )
    loss = history["loss"].mean(-1).reshape(EPOCHS, 8).mean(-1)  # members' mean, per epoch
    print("training loss per epoch (mean of the members):", [round(v, 3) for v in loss.tolist()])

    evaluate = fd.nn.eval_mode(model)  # dropout off, no key needed
    logits = fd.vmap(lambda p: evaluate(fd.combine(p, held), test)["logits"])(ensemble)
    acc = (logits.argmax(-1) == test["label"]).float().mean(-1)
    mean_acc = (logits.softmax(-1).mean(0).argmax(-1) == test["label"]).float().mean()
    print("test accuracy per member:", [round(a, 3) for a in acc.tolist()])
    print(f"test accuracy of the averaged ensemble: {mean_acc:.3f}")
    frozen = fd.from_module(bert).get_tensor(("embeddings", "word_embeddings", "weight"))
    untouched = held.get_tensor(("0", "embeddings", "word_embeddings", "weight"))
    assert torch.equal(untouched, frozen)
    return {
        "first_loss": float(loss[0]),
        "last_loss": float(loss[-1]),
        "member_min_acc": float(acc.min()),
        "ensemble_acc": float(mean_acc),
    }


if __name__ == "__main__":
    main()
