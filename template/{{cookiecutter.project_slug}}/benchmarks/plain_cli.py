"""Lightning's floor for start-up, which benchmarks/startup.py starts beside the project's `fit`: the example's model
and data in a plain `LightningCLI(ImageClassifier, ImageDataModule)`, with Lightning's defaults and none of the
engine's command line, Trainer or callbacks (the model's recipe imports what it uses of the engine).

`python benchmarks/plain_cli.py fit --model.num_classes 10 --model.in_channels 1 --model.input_size 8`: the values
that the project's CLI takes from the data.
"""

from lightning.pytorch.cli import LightningCLI

from template_package.classifier.data import ImageDataModule
from template_package.classifier.model import ImageClassifier

if __name__ == "__main__":
    LightningCLI(ImageClassifier, ImageDataModule)
