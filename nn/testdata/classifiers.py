"""The PyTorch twins of nn's classifiers (nn.New "logreg", "mlp", "cnn"),
with the module indices Starling's names use, so that

    model.load_state_dict(state_dict, strict=True)

loads the weights a Starling classifier saved (Model.SaveFile) and
model(x) gives the logits Starling's Model.Forward gives for the same
batch (up to float32 rounding).

Starling's images are channels last, [N, H, W, C]; torch's Conv2d takes
[N, C, H, W]. The weights need no change (Starling stores Conv2d weights
as torch does, [out, in, kh, kw], and its Flatten emits torch's
channels-first order), only the input: pass x.permute(0, 3, 1, 2), as
nchw() does.
"""
import torch.nn as nn


def logreg(inputs=784, classes=10):
    return nn.Sequential(nn.Linear(inputs, classes))


def mlp(widths=(784, 200, 200, 10)):
    """Linear layers of the given widths with a ReLU between them:
    "0.weight", "2.weight", … as in Starling's Sequential."""
    mods = []
    for i in range(1, len(widths)):
        if i > 1:
            mods.append(nn.ReLU())
        mods.append(nn.Linear(widths[i - 1], widths[i]))
    return nn.Sequential(*mods)


def cnn(h=28, w=28, c=1, classes=10):
    """FedAvg's CNN (McMahan et al. 2017) with "same" padding."""
    return nn.Sequential(
        nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear((h // 4) * (w // 4) * 64, 512), nn.ReLU(),
        nn.Linear(512, classes),
    )


def nchw(x):
    """Starling's channels-last batch [N, H, W, C] as torch's [N, C, H, W]."""
    return x.permute(0, 3, 1, 2)
