"""Weight gradients summed over row chunks and bias gradients as products (trainer/learners/splitk.py):
the same gradients as one product and a sum, for plain layers and the twin critics' batched ones,
whichever inputs want gradients; the learners' `grad_row_chunks` reaches every layer and leaves
their updates as they were. Whether they pay is the GPU's question (bench/gpu_check.sh); the cuda
tests here run there."""
import pytest
import torch
from torch.nn import functional as F

from simbridge.trainer.learners import capture, splitk
from support.learners import filled, weights

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def test_chunks_divide_the_rows_and_small_batches_stay_whole():
    assert splitk.chunks_for(4096, 8) == 8
    assert splitk.chunks_for(4096, 1) == 1
    assert splitk.chunks_for(splitk.MIN_ROWS - 1, 8) == 1
    assert splitk.chunks_for(1028, 8) == 4   # 1028 = 4 * 257: the largest power-of-two cut that divides
    assert splitk.chunks_for(1025, 8) == 1


@pytest.mark.parametrize("x_grad,chunks,product", [(True, 8, False), (False, 8, False), (True, 1, True),
                                                   (True, 8, True)])
def test_a_linear_layers_gradients_equal_one_products(x_grad, chunks, product, monkeypatch):
    if product:
        monkeypatch.setattr(splitk, "BIAS_BY_PRODUCT", ("cpu",))
        mv = torch.mv
        calls = []
        monkeypatch.setattr(torch, "mv", lambda *a: (calls.append(1), mv(*a))[1])
    torch.manual_seed(0)
    one, split = torch.nn.Linear(24, 40).double(), splitk.Linear(24, 40).double()   # torch's own beside it
    split.load_state_dict(one.state_dict())
    split.grad_row_chunks = chunks
    x = torch.randn(2048, 24, dtype=torch.float64)
    xs = [x.clone().requires_grad_(x_grad) for _ in range(2)]
    outs = [m(xi) for m, xi in zip((one, split), xs)]
    torch.testing.assert_close(outs[0], outs[1])
    g = torch.randn_like(outs[0])
    for o in outs:
        o.backward(g)
    torch.testing.assert_close(split.weight.grad, one.weight.grad)
    torch.testing.assert_close(split.bias.grad, one.bias.grad)
    torch.testing.assert_close(split.weight.grad, g.t() @ x)   # the formula itself, not just agreement
    torch.testing.assert_close(split.bias.grad, g.sum(0))
    if x_grad:
        torch.testing.assert_close(xs[1].grad, xs[0].grad)
    if product:
        assert calls == [1]   # the bias gradient, as a product


@pytest.mark.parametrize("product", [False, True])
def test_the_twin_critics_batched_layer_with_an_expanded_input(product, monkeypatch):
    if product:
        monkeypatch.setattr(splitk, "BIAS_BY_PRODUCT", ("cpu",))
    torch.manual_seed(0)
    w = torch.randn(2, 5, 64, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 1, 64, dtype=torch.float64, requires_grad=True)
    x0 = torch.randn(4096, 5, dtype=torch.float64, requires_grad=True)
    grads = []
    for chunks in (None, 1, 16):   # None: torch's own ops, the reference
        x = x0.expand(2, -1, -1)   # both critics read the same rows, as TwinQ's first layer
        y = torch.bmm(x, w) + b if chunks is None else splitk.bmm(x, w, b, chunks)
        assert (y.grad_fn.name() == "_BMMBackward") == (chunks == 16 or (product and chunks == 1))
        (y.square().sum()).backward()
        grads.append([t.grad.clone() for t in (w, b, x0)])
        for t in (w, b, x0):
            t.grad = None
    for got in grads[1:]:
        for a, c in zip(grads[0], got):
            torch.testing.assert_close(c, a)


def test_without_gradients_it_is_the_plain_product():
    m = splitk.Linear(8, 4)
    m.grad_row_chunks = 8
    x = torch.randn(2048, 8)
    with torch.no_grad():
        y = m(x)
    assert y.grad_fn is None
    torch.testing.assert_close(y, F.linear(x, m.weight, m.bias))
    w = torch.randn(2, 8, 4)   # no gradient wanted: torch's own op
    assert splitk.bmm(x.expand(2, -1, -1), w, torch.zeros(2, 1, w.shape[-1]), 8).grad_fn is None


@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_a_learner_with_bias_gradients_as_products_updates_as_before(kind, monkeypatch):
    """Every layer of the learner (DQN's 2-D ones, SAC's actor and twin critics) at 1,024 rows."""
    one = filled(kind)
    monkeypatch.setattr(splitk, "BIAS_BY_PRODUCT", ("cpu",))
    bias_grad = splitk._bias_grad
    products = []
    monkeypatch.setattr(splitk, "_bias_grad", lambda g, by: (products.append(by), bias_grad(g, by))[1])
    product = filled(kind)
    for lrn in (one, product):
        lrn.train(max_updates=5)
    assert products and all(products)
    assert one.updates == product.updates == 5
    for a, b in zip(weights(one), weights(product)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)   # float sums in another order


@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_a_learner_with_row_chunks_reaches_every_layer_and_updates_as_before(kind):
    one, split = filled(kind), filled(kind, grad_row_chunks=8)
    chunked = [m for m in split.__dict__.values() if isinstance(m, torch.nn.Module)
               for s in m.modules() if getattr(s, "grad_row_chunks", None) == 8]
    assert chunked, "no layer of the learner took grad_row_chunks"
    for lrn in (one, split):
        lrn.train(max_updates=5)
    assert one.updates == split.updates == 5
    for a, b in zip(weights(one), weights(split)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)   # float sums in another order


def test_a_bad_grad_row_chunks_is_refused():
    for bad in (0, "8", True, 2.0):
        with pytest.raises(ValueError, match="grad_row_chunks must be \"auto\" or an integer >= 1"):
            filled("dqn", grad_row_chunks=bad)


def test_auto_cuts_the_twin_critics_batched_products_on_cuda_only():
    """"auto": cuBLAS splits a 2-D product's rows itself, not a batched one's (an H200: 40 us for
    a twin layer's gradient over 4,096 rows as one product, 14.5 in 8 chunks); the CPU gains
    nothing from chunks."""
    class Twin(torch.nn.Module):
        BATCHED_PRODUCT = True
        grad_row_chunks = 1
    net = torch.nn.Sequential(splitk.Linear(4, 4), Twin())
    splitk.set_chunks(net, "auto", "cuda")
    assert (net[0].grad_row_chunks, net[1].grad_row_chunks) == (1, splitk.AUTO_BATCHED)
    splitk.set_chunks(net, "auto", "cpu")
    assert (net[0].grad_row_chunks, net[1].grad_row_chunks) == (1, 1)
    splitk.set_chunks(net, 4, "cpu")   # a number: every layer, on any device
    assert (net[0].grad_row_chunks, net[1].grad_row_chunks) == (4, 4)
    sac = filled("sac")   # the learner's default reaches its critics as "auto" on its device
    assert sac.config["grad_row_chunks"] == "auto"
    assert {m.grad_row_chunks for m in sac.critic.modules() if hasattr(m, "grad_row_chunks")} == {1}


@pytest.mark.parametrize("kind,product", [("dqn", False), ("sac", False), ("sac", True)])
def test_row_chunks_trace_under_torch_compile(kind, product, monkeypatch):
    """The compile path traces the custom backward (aot_eager: no inductor code generation), bias
    gradients as products too."""
    if product:
        monkeypatch.setattr(splitk, "BIAS_BY_PRODUCT", ("cpu",))
    torch._dynamo.reset()
    lrn = filled(kind, grad_row_chunks=4, update_path="compile")
    lrn.updater._compiler = lambda fn: torch.compile(fn, backend="aot_eager", dynamic=False)
    ref = filled(kind, grad_row_chunks=4)
    for x in (lrn, ref):
        x.train(max_updates=3)
    assert lrn.updater.path == "compile", lrn.updater.reason
    for a, b in zip(weights(ref), weights(lrn)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@cuda
@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_row_chunks_on_the_graph_path_equal_one_product_on_cuda(kind):
    one = filled(kind, device="cuda", update_path="graph", grad_row_chunks=1)
    split = filled(kind, device="cuda", update_path="graph", grad_row_chunks=8)
    for lrn in (one, split):
        lrn.train(max_updates=capture.WARMUP + 20)   # warm-up, capture, replays
    assert split.updater.path == "graph" and len(split.updater._graphs) >= 1
    for a, b in zip(weights(one), weights(split)):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@cuda
@pytest.mark.parametrize("kind", ["dqn", "sac"])
def test_bias_gradients_as_products_on_the_graph_path_equal_sums_on_cuda(kind, monkeypatch):
    one = filled(kind, device="cuda", update_path="graph")
    monkeypatch.setattr(splitk, "BIAS_BY_PRODUCT", ("cuda",))
    product = filled(kind, device="cuda", update_path="graph")
    for lrn in (one, product):
        lrn.train(max_updates=capture.WARMUP + 20)   # warm-up, capture (with the setting), replays
    assert product.updater.path == "graph" and len(product.updater._graphs) >= 1
    for a, b in zip(weights(one), weights(product)):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
