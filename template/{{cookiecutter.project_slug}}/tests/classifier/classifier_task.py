"""The example's classes, named on the command line of the example's tests: they test the example whatever
configs/default.yaml names."""

CLASSIFIER = ["--model=template_package.classifier.model.ImageClassifier",
              "--data=template_package.classifier.data.ImageDataModule"]  # fmt: skip
