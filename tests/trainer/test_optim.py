"""trainer/learners/optim.py: Adam and clip_grad_norm equal torch's own bit for bit, and checkpoints move
between the two (that a learner that trains never imports torch._dynamo: test_update_paths.py)."""
import copy

import pytest
import torch

from simbridge.trainer.learners import optim


def _net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _grads(net, step):
    g = torch.Generator().manual_seed(step)
    for i, p in enumerate(net.parameters()):
        # the last bias has no gradient every third step: Adam leaves it (and its state) as it is
        p.grad = None if (i == 3 and step % 3 == 0) else torch.randn(p.shape, generator=g)


@pytest.mark.parametrize("tensor_lr", [False, True])
def test_adam_steps_equal_torch_fused_adam_bit_for_bit(tensor_lr):
    ours_net, torch_net = _net(), _net()
    lr = (lambda: torch.tensor(3e-3)) if tensor_lr else (lambda: 3e-3)
    ours = optim.Adam(ours_net.parameters(), lr(), eps=1e-5, weight_decay=0.01)
    ref = torch.optim.Adam(torch_net.parameters(), lr=lr(), eps=1e-5, weight_decay=0.01, fused=True)
    for step in range(12):
        for net, opt in ((ours_net, ours), (torch_net, ref)):
            _grads(net, step)
            opt.step()
            opt.zero_grad(set_to_none=True)
    for a, b in zip(ours_net.parameters(), torch_net.parameters()):
        assert torch.equal(a, b)
    assert all(p.grad is None for p in ours_net.parameters())


@pytest.mark.parametrize("tensor_lr", [False, True])
def test_adam_under_torch_compile_runs_the_fused_kernels_arithmetic_as_traceable_ops(tensor_lr, monkeypatch):
    """Inside a torch.compile'd step the kernel cannot be traced (no fake kernel for its tensor-lr
    form); the traced form computes the same to float rounding, state included."""
    fused_net, traced_net = _net(), _net()
    lr = (lambda: torch.tensor(3e-3)) if tensor_lr else (lambda: 3e-3)
    fused = optim.Adam(fused_net.parameters(), lr(), eps=1e-5, weight_decay=0.01)
    traced = optim.Adam(traced_net.parameters(), lr(), eps=1e-5, weight_decay=0.01)
    kernel = torch._fused_adam_
    for step in range(12):
        _grads(fused_net, step)
        fused.step()
        _grads(traced_net, step)
        with monkeypatch.context() as m:
            m.setattr(torch.compiler, "is_compiling", lambda: True)
            m.setattr(torch, "_fused_adam_", None)   # the traced form must not call it
            traced.step()
        assert torch._fused_adam_ is kernel
    for a, b in zip(fused_net.parameters(), traced_net.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)   # steps of ~3e-3 each
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(fused.state[a][key], traced.state[b][key], rtol=1e-5, atol=1e-7)


def test_zero_grad_in_place_keeps_each_gradient_tensor_and_zeroes_it(monkeypatch):
    """In place (asked, or inside a compiled step: its pieces guard on the gradient tensors) every
    gradient is zeroed, in one foreach kernel, and stays the same tensor; a missing one stays None."""
    net = _net()
    opt = optim.Adam(net.parameters(), 1e-3)
    for compiling in (False, True):
        _grads(net, 3)   # the last bias without a gradient
        before = [p.grad for p in net.parameters()]
        with monkeypatch.context() as m:
            m.setattr(torch.compiler, "is_compiling", lambda: compiling)
            opt.zero_grad(set_to_none=compiling)   # True under the compiler still zeroes in place
        after = [p.grad for p in net.parameters()]
        assert all(a is b for a, b in zip(after, before)) and after[3] is None
        assert all(not g.any() for g in after if g is not None)
    opt.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_a_state_dict_moves_between_this_adam_and_torchs_both_ways():
    nets = [_net() for _ in range(4)]
    ours = optim.Adam(nets[0].parameters(), 1e-2)
    ref = torch.optim.Adam(nets[1].parameters(), lr=1e-2, fused=True)
    for step in range(5):
        for net, opt in ((nets[0], ours), (nets[1], ref)):
            _grads(net, step)
            opt.step()
    # each state goes to a new optimizer of the other kind, over a copy of the weights it belongs to
    nets[2].load_state_dict(nets[0].state_dict())
    nets[3].load_state_dict(nets[1].state_dict())
    to_torch = torch.optim.Adam(nets[2].parameters(), lr=1.0, fused=True)
    to_torch.load_state_dict(copy.deepcopy(ours.state_dict()))   # as a checkpoint: no shared tensors
    to_ours = optim.Adam(nets[3].parameters(), 1.0)
    to_ours.load_state_dict(copy.deepcopy(ref.state_dict()))
    assert to_ours.param_groups[0]["lr"] == 1e-2 and to_ours.state[next(nets[3].parameters())]["step"] == 5
    for step in range(5, 9):
        for net, opt in ((nets[0], ours), (nets[1], ref), (nets[2], to_torch), (nets[3], to_ours)):
            _grads(net, step)
            opt.step()
    for a, b, c, d in zip(*(n.parameters() for n in nets)):
        assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)


def test_adam_refuses_what_it_does_not_implement():
    with pytest.raises(ValueError, match="amsgrad"):
        optim.Adam(_net().parameters(), 1e-3, amsgrad=True)
    with pytest.raises(TypeError, match="unsupported"):
        optim.Adam(_net().parameters(), 1e-3, momentum=0.9)
    with pytest.raises(ValueError, match="number of parameters"):
        optim.Adam(_net().parameters(), 1e-3).load_state_dict(
            optim.Adam(list(_net().parameters())[:2], 1e-3).state_dict())


@pytest.mark.parametrize("max_norm", [0.5, 1e9])
def test_clip_grad_norm_equals_torchs_bit_for_bit(max_norm):
    a, b = _net(), _net()
    _grads(a, 1)
    _grads(b, 1)
    na = optim.clip_grad_norm(a.parameters(), max_norm)
    nb = torch.nn.utils.clip_grad_norm_(b.parameters(), max_norm)
    assert torch.equal(na, nb) and na > 0.5
    for p, q in zip(a.parameters(), b.parameters()):
        assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad)

