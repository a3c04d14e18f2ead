"""The C++ runtime's checkpoints in torch: examples/train (the runtime's classifier, AdamW,
2 ranks) saves for a few steps; an equivalent torch model and torch.optim.AdamW load model
and optimizer through ckpt.torch, bit-identical to what the checkpoint holds, and one more
torch step from step N lands where the C++ step N+1 did (float tolerance)."""
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import ckpt

if os.environ.get("CKPT_REQUIRE_TORCH"):
    import torch  # scripts/test.sh's venv has torch: a missing one is a failure there
else:
    torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ckpt.torch  # noqa: E402

# examples/train's model, small: --vocab 32 --dim 16 --hidden 24 --layers 2 (16 classes).
VOCAB, DIM, HIDDEN, LAYERS, CLASSES = 32, 16, 24, 2, 16
BETAS, EPS, WEIGHT_DECAY = (0.9, 0.999), 1e-8, 0.01  # ckpt::runtime::AdamWOptions' defaults


class MlpBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Classifier(nn.Module):
    """The torch twin of ckpt_demo::Classifier: same parameter names and shapes."""

    def __init__(self):
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, DIM, mode="mean")
        self.blocks = nn.Sequential(*[MlpBlock() for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens):
        return self.head(self.norm(self.blocks(self.embed(tokens))))


def step_dir(root, step):
    return os.path.join(root, f"step-{step:08d}")  # CheckpointManager's names


@pytest.fixture(scope="module", params=["fsdp", "tp"])
def trained(request):
    """Checkpoint root of `train --world 2 --strategy S` after 4 steps, saved every step."""
    train = os.environ.get("CKPT_TRAIN")
    if not train:
        pytest.skip("CKPT_TRAIN not set (run through CTest)")
    scratch = os.environ.get("CKPT_TEST_TMP") or tempfile.gettempdir()
    os.makedirs(scratch, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"train-{request.param}-", dir=scratch)
    root = os.path.join(work, "ck")
    p = subprocess.run([train, "--world", "2", "--strategy", request.param, "--steps", "4", "--save-every", "1",
                        "--keep", "2", "--ckpt-dir", str(root), "--vocab", str(VOCAB), "--dim", str(DIM),
                        "--hidden", str(HIDDEN), "--layers", str(LAYERS), "--batch", "8", "--lr", "0.05",
                        "--log-every", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    yield root
    shutil.rmtree(work, ignore_errors=True)


def bits(t):
    return t.detach().contiguous().view(torch.int32)


def test_model_and_adamw_load_bit_identical(trained):
    path = step_dir(trained, 3)
    model = Classifier()
    opt = torch.optim.AdamW(model.parameters(), lr=1.0, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    ckpt.torch.load_module_state(path, model)
    ckpt.torch.load_optimizer_state(path, model, opt)
    with ckpt.open(path) as c:
        assert c.world_size == 2
        names = [n for n, _ in model.named_parameters()]
        assert sorted("model." + n for n in names) == sorted(k for k in c.keys() if k.startswith("model."))
        sd = opt.state_dict()
        assert sd["param_groups"][0]["lr"] == c.read("optimizer.lr")
        assert opt.param_groups[0]["lr"] == c.read("optimizer.lr") != 1.0
        for i, (n, p) in enumerate(model.named_parameters()):
            assert torch.equal(bits(p), bits(c.read("model." + n, like="torch"))), n
            state = opt.state[p]
            for name in ("exp_avg", "exp_avg_sq"):
                stored = c.read(f"optimizer.state.model.{n}.{name}", like="torch")
                assert torch.equal(bits(state[name]), bits(stored)), (n, name)
                assert torch.equal(bits(sd["state"][i][name]), bits(stored)), (n, name)
                assert stored.abs().sum() > 0, (n, name)  # trained state, not zeros
            assert state["step"].item() == c.read(f"optimizer.state.model.{n}.step") == 3
    # The torch twin runs, and torch's AdamW steps from the loaded state.
    tokens = torch.randint(0, VOCAB, (4, 8))
    loss = model(tokens).logsumexp(1).mean()
    loss.backward()
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert all(opt.state[p]["step"].item() == 4 for p in model.parameters())


def test_next_torch_step_matches_the_cpp_step(trained):
    """torch.optim.AdamW's update rule is the runtime's: from step 3 with step 4's gradient
    (recovered from the two exp_avg: g = (m4 - b1 m3) / (1 - b1)), torch lands on step 4."""
    model = Classifier()
    opt = torch.optim.AdamW(model.parameters(), lr=1.0, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    ckpt.torch.load_module_state(step_dir(trained, 3), model)
    ckpt.torch.load_optimizer_state(step_dir(trained, 3), model, opt)
    with ckpt.open(step_dir(trained, 3)) as c3, ckpt.open(step_dir(trained, 4)) as c4:
        for n, p in model.named_parameters():
            m3 = c3.read(f"optimizer.state.model.{n}.exp_avg").astype(np.float64)
            m4 = c4.read(f"optimizer.state.model.{n}.exp_avg").astype(np.float64)
            p.grad = torch.from_numpy((m4 - BETAS[0] * m3) / (1 - BETAS[0])).float()
        opt.step()
        worst = 0.0
        for n, p in model.named_parameters():
            want = c4.read("model." + n, like="torch")
            moved = (want - c3.read("model." + n, like="torch")).abs().max().item()
            assert moved > 0, n
            err = (p.detach() - want).abs().max().item()
            worst = max(worst, err / moved)
            torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-6, msg=n)
            torch.testing.assert_close(opt.state[p]["exp_avg_sq"],
                                       c4.read(f"optimizer.state.model.{n}.exp_avg_sq", like="torch"),
                                       rtol=1e-4, atol=1e-12, msg=n)
        assert worst < 1e-2  # well inside one step's movement


def test_sgd_momentum_and_errors(tmp):
    """SGD's momentum_buffer maps too; missing keys, other shapes and another optimizer's
    state are ckpt.Errors naming the file and key."""
    model = nn.Linear(3, 2)
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    with ckpt.Writer(tmp + "/sgd") as wr:
        wr.write("model.weight", w)
        wr.write("model.bias", np.array([1.5, -2.0], dtype=np.float32))
        wr.write("optimizer.state.model.weight.momentum_buffer", w * 0.5)
        wr.write("optimizer.state.model.weight.step", 2)
        wr.write("optimizer.state.model.bias.momentum_buffer", np.array([0.25, 0.5], dtype=np.float32))
        wr.write("optimizer.state.model.bias.step", 2)
        wr.write("optimizer.lr", 0.125)
    sgd = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    ckpt.torch.load_module_state(tmp + "/sgd", model)
    ckpt.torch.load_optimizer_state(tmp + "/sgd", model, sgd)
    assert torch.equal(model.weight.detach(), torch.from_numpy(w))
    assert torch.equal(sgd.state[model.weight]["momentum_buffer"], torch.from_numpy(w * 0.5))
    assert torch.equal(sgd.state[model.bias]["momentum_buffer"], torch.tensor([0.25, 0.5]))
    assert sgd.param_groups[0]["lr"] == 0.125

    adam = torch.optim.AdamW(model.parameters())
    with pytest.raises(ckpt.Error) as e:  # SGD's state is not AdamW's
        ckpt.torch.load_optimizer_state(tmp + "/sgd", model, adam)
    assert e.value.key == "optimizer.state.model.weight.momentum_buffer" and "sgd" in str(e.value.file)
    other = nn.Linear(4, 2)  # another shape
    with pytest.raises(ckpt.Error) as e:
        ckpt.torch.load_module_state(tmp + "/sgd", other)
    assert e.value.key == "model.weight" and "shape [2, 3]" in str(e.value)
    with pytest.raises(ckpt.Error) as e:
        ckpt.torch.load_optimizer_state(tmp + "/sgd", model, sgd, prefix="opt")
    assert e.value.key == "opt.lr"
    with pytest.raises(ckpt.Error) as e:
        ckpt.torch.load_module_state(tmp + "/sgd", nn.Sequential(nn.Linear(3, 2)))
    assert e.value.key == "model.0.weight"
