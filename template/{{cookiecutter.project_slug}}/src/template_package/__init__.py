"""An image classifier trained with Lightning: network, LightningModule, DataModule and CLI, each in its own module."""
