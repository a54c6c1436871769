"""The models and random batches of the synthetic benchmarks.

``make(kind, device, batch_size, ...)`` returns ``(model, inputs, targets)``:
- ``resnet50``, ``resnet18``: torchvision's, on 224x224 images, 1000 classes
  (torchvision must be installed; without it ``resnet18`` is the same
  network from resnet_plain.py);
- ``transformer``: a ``torch.nn.TransformerEncoder`` (pre-norm, GELU) over
  token embeddings, mean-pooled into a classifier; 12 layers of width 512 and
  sequence length 128 unless told otherwise;
- ``mlp``: 1024 -> 2048 -> 2048 -> 2048 -> 1000 (12.5M parameters);
  ``small-mlp``: 256 -> 512 -> 256 -> 100 (0.3M, for smoke tests).
"""
import torch
import torch.nn as nn

MODELS = ("resnet50", "resnet18", "transformer", "mlp", "small-mlp")


class TransformerClassifier(nn.Module):
    def __init__(self, vocab=32000, width=512, layers=12, heads=8, classes=1000):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def mlp(sizes):
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def make(kind, device, batch_size, width=512, layers=12, seq_len=128):
    """The model (on ``device``) and one random batch for it."""
    if kind in ("resnet50", "resnet18"):
        try:
            import torchvision
            model = getattr(torchvision.models, kind)(num_classes=1000)
        except ImportError as exc:
            if kind != "resnet18":
                raise SystemExit(f"--model {kind} needs torchvision ({exc}); "
                                 "--model resnet18 or transformer needs only torch") from None
            from resnet_plain import ResNet18
            model = ResNet18(num_classes=1000)
        inputs = torch.randn(batch_size, 3, 224, 224)
        classes = 1000
    elif kind == "transformer":
        model = TransformerClassifier(width=width, layers=layers, heads=max(1, width // 64))
        inputs = torch.randint(0, 32000, (batch_size, seq_len))
        classes = 1000
    elif kind in ("mlp", "small-mlp"):
        sizes = [1024, 2048, 2048, 2048, 1000] if kind == "mlp" else [256, 512, 256, 100]
        model = mlp(sizes)
        inputs = torch.randn(batch_size, sizes[0])
        classes = sizes[-1]
    else:
        raise SystemExit(f"unknown --model {kind!r}; one of {', '.join(MODELS)}")
    targets = torch.randint(0, classes, (batch_size,))
    return model.to(device), inputs.to(device), targets.to(device)
