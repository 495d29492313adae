"""The example's LightningModule: cross-entropy training of an image classifier from nets.py, on the engine's
training recipe (AdamW groups, per-step warmup-cosine, clipping with its diagnostics, the NaN stop: see
engine/training/recipe.py).

Metric names: train/loss, lr, train/grad_norm, train/clip_share (written by the recipe), val/loss, val/acc,
test/loss, test/acc.
"""

import torch
import torch.nn.functional as F
from lightning.fabric.utilities.throughput import measure_flops
from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy

from ..engine import TrainingRecipe, UsageError
from .nets import create_net


class ImageClassifier(TrainingRecipe):
    """Classifies images into `num_classes` classes.

    Args:
        arch: "small_cnn" or a torchvision model name, see nets.create_net.
        num_classes: number of classes; left at None, the CLI takes it from the DataModule.
        in_channels: image channels; left at None, the CLI takes it from the DataModule.
        input_size: side of the square images the network sees; left at None, the CLI takes it from the
            DataModule. Gives the model its `example_input_array` (the model summary's sizes and FLOPs, the input of
            `export`).
        pretrained: start a torchvision arch from ImageNet weights (downloads them).
        label_smoothing: cross-entropy label smoothing.
        dropout: dropout before the head of small_cnn (0: none).
        compile: compile the network with torch.compile (in place, so checkpoints keep the plain parameter names
            and load into an uncompiled model): true, or a torch.compile mode such as "reduce-overhead", which
            replays each step's kernels as CUDA graphs (what pays for small models, whose steps are short next to
            the time it takes to launch their kernels one by one). Pays off on GPUs; the first steps are slow.
        channels_last: keep conv weights and input images in channels-last (NHWC) memory layout, which the
            tensor-core convolution kernels of mixed precision on CUDA read without transposing. Checkpoints load
            either way; benchmarks/overhead.py --gpu --channels-last shows what it gains.
        recipe: the training recipe's options (lr, betas, warmup, decay_steps, ...): TrainingRecipe's arguments.
    """

    def __init__(
        self,
        arch: str = "small_cnn",
        num_classes: int | None = None,
        in_channels: int | None = None,
        input_size: int | None = None,
        pretrained: bool = False,
        label_smoothing: float = 0.0,
        dropout: float = 0.0,
        compile: bool | str = False,
        channels_last: bool = False,
        **recipe,
    ) -> None:
        super().__init__(**recipe)
        if num_classes is None or in_channels is None:
            raise UsageError("ImageClassifier needs num_classes and in_channels (the CLI takes them from the data)")
        self.save_hyperparameters()
        self.net = create_net(arch, num_classes, in_channels, pretrained, dropout)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        if input_size is not None:
            self.example_input_array = torch.zeros(2, in_channels, input_size, input_size)

    def configure_model(self) -> None:
        if self.hparams.channels_last:
            self.net.to(memory_format=torch.channels_last)  # in place: the optimizer sees the same parameters
        if self.hparams.compile:
            mode = None if self.hparams.compile is True else self.hparams.compile
            self.net.compile(mode=mode)  # nn.Module.compile: unlike torch.compile(net), adds no "_orig_mod." to keys

    def forward(self, images: Tensor) -> Tensor:
        if self.hparams.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.net(images)

    def _loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits, targets, label_smoothing=self.hparams.label_smoothing)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, targets = batch
        return self._loss(self(images), targets)  # logged by the recipe as train/loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, targets = batch
        logits = self(images)
        self.val_acc.update(logits, targets)
        self.log("val/loss", self._loss(logits, targets), prog_bar=True, sync_dist=True)  # the mean over all ranks
        self.log("val/acc", self.val_acc, prog_bar=True)
        return logits  # for callbacks, e.g. ConfusionMatrixImage

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        images, targets = batch
        logits = self(images)
        self.test_acc.update(logits, targets)
        self.log("test/loss", self._loss(logits, targets), sync_dist=True)
        self.log("test/acc", self.test_acc)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Class probabilities for each image of the batch."""
        images, _ = batch
        return self(images).softmax(dim=-1)

    def flops_per_sample(self) -> int | None:
        """FLOPs of training on one image, forward and backward, for `perf/mfu` (engine/report/throughput.py):
        Lightning's `measure_flops` on a copy of the network built on the meta device, so counting allocates nothing
        and draws no random numbers (training draws the same with and without it). Counted on 2 images (BatchNorm
        refuses 1), halved. None without an image size."""
        hp = self.hparams
        if hp.input_size is None:
            return None
        with torch.device("meta"):
            net = create_net(hp.arch, hp.num_classes, hp.in_channels, False, hp.dropout)
            images = torch.empty(2, hp.in_channels, hp.input_size, hp.input_size)
        return measure_flops(net, lambda: net(images), lambda logits: logits.sum()) // 2
