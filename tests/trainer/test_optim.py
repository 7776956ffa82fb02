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


def _slice_on_cpu(m, size=16):
    """optim.sliced as on cuda, here: Linear(4, 16)'s 64 weights in 4 slices of 16."""
    m.setattr(optim, "SLICED_DEVICES", ("cpu", "cuda"))
    m.setattr(optim, "SLICE", size)


@pytest.mark.parametrize("tensor_lr,in_slices", [(False, False), (True, False), (False, True), (True, True)])
def test_adam_steps_equal_torch_fused_adam_bit_for_bit(tensor_lr, in_slices, monkeypatch):
    """in_slices: the large tensors given to the kernel as slices (on cuda, where a 65,536-element
    tensor was one thread block): the same arithmetic, element by element, so the same bits."""
    if in_slices:
        _slice_on_cpu(monkeypatch)
        kernel, given = torch._fused_adam_, []
        monkeypatch.setattr(torch, "_fused_adam_", lambda params, *a, **kw: (given.append(len(params)),
                                                                          kernel(params, *a, **kw)))
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
        assert torch.equal(ours.state[a]["exp_avg_sq"], ref.state[b]["exp_avg_sq"])
        assert torch.equal(ours.state[a]["step"], ref.state[b]["step"])
    assert all(p.grad is None for p in ours_net.parameters())
    if in_slices:   # each step ours, then torch's (whole tensors): weights of 64 and 48 elements in 4 + 3
        # slices of 16, the biases (16, 3) whole; every third step the last bias has no gradient
        assert given[0::2] == [8 if step % 3 == 0 else 9 for step in range(12)]
        assert given[1::2] == [3 if step % 3 == 0 else 4 for step in range(12)]


def test_sliced_cuts_each_large_tensor_alike_into_views_and_repeats_what_it_is_told(monkeypatch):
    _slice_on_cpu(monkeypatch, size=4)
    a, b = torch.arange(10.0), torch.zeros(10)
    small, t = torch.ones(3), torch.tensor(7.0)
    (xs, ys), (ts,) = optim.sliced([[a, small], [b, small.clone()]], [[t, t]])
    assert [len(x) for x in xs] == [len(y) for y in ys] == [4, 4, 2, 3] and len(ts) == 4 and all(r is t for r in ts)
    torch._foreach_add_(ys, xs)   # views: the writes land in b
    assert torch.equal(b, a)
    # a non-contiguous member leaves its whole group whole (the lists must stay aligned)
    strided = torch.zeros(20)[::2]
    (xs, ys), _ = optim.sliced([[a], [strided]])
    assert xs[0] is a and ys[0] is strided
    with monkeypatch.context() as m:   # inside torch.compile: as they are
        m.setattr(torch.compiler, "is_compiling", lambda: True)
        assert optim.sliced([[a]])[0][0][0] is a
    monkeypatch.setattr(optim, "SLICED_DEVICES", ("cuda",))
    assert optim.sliced([[a]])[0][0][0] is a   # the CPU default: whole


@pytest.mark.parametrize("tau", [0.005, 1.0])
def test_soft_update_in_slices_equals_torchs_lerp_and_copy(tau, monkeypatch):
    _slice_on_cpu(monkeypatch)
    target, source, ref = _net(0), _net(1), _net(0)
    optim.soft_update(target.parameters(), source.parameters(), tau)
    with torch.no_grad():
        for r, s in zip(ref.parameters(), source.parameters()):
            r.copy_(s) if tau >= 1 else r.lerp_(s, tau)
    for a, b in zip(target.parameters(), ref.parameters()):
        assert torch.equal(a, b)


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


@pytest.mark.parametrize("max_norm,in_slices", [(0.5, False), (1e9, False), (0.5, True)])
def test_clip_grad_norm_equals_torchs_bit_for_bit(max_norm, in_slices, monkeypatch):
    if in_slices:
        _slice_on_cpu(monkeypatch)
    a, b = _net(), _net()
    _grads(a, 1)
    _grads(b, 1)
    na = optim.clip_grad_norm(a.parameters(), max_norm)
    nb = torch.nn.utils.clip_grad_norm_(b.parameters(), max_norm)
    assert torch.equal(na, nb) and na > 0.5
    for p, q in zip(a.parameters(), b.parameters()):
        assert (p.grad is None and q.grad is None) or torch.equal(p.grad, q.grad)



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs cuda, where the slices are cut (the GPU check runs it)")
def test_on_cuda_adam_and_soft_update_in_slices_equal_whole_tensors_bit_for_bit(monkeypatch):
    """A 256x256 layer (65,536 weights: one thread block whole, 16 in slices) and a twin critic's
    stacked (2, 256, 256) weights, capturable with a tensor lr as on the graph path."""
    torch.manual_seed(0)
    params = [torch.randn(256, 256, device="cuda"), torch.randn(2, 256, 256, device="cuda"),
              torch.randn(256, device="cuda")]
    sliced_p = [p.clone().requires_grad_() for p in params]
    whole_p = [p.clone().requires_grad_() for p in params]
    targets = [[p.clone() for p in params] for _ in range(2)]
    lr = lambda: torch.tensor(1e-3, device="cuda")   # noqa: E731
    sliced_opt = optim.Adam(sliced_p, lr(), capturable=True)
    whole_opt = optim.Adam(whole_p, lr(), capturable=True)
    for step in range(5):
        g = torch.Generator(device="cuda").manual_seed(step)
        grads = [torch.randn(p.shape, device="cuda", generator=g) for p in params]
        for ps, opt, target, cut in ((sliced_p, sliced_opt, targets[0], True), (whole_p, whole_opt, targets[1], False)):
            for p, gr in zip(ps, grads):
                p.grad = gr.clone()
            with monkeypatch.context() as m:
                m.setattr(optim, "SLICED_DEVICES", ("cuda",) if cut else ())
                opt.step()
                optim.soft_update(target, ps, 0.01)
    for a, b in zip(sliced_p + targets[0], whole_p + targets[1]):
        assert torch.equal(a, b)
