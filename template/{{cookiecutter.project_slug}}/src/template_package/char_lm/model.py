"""The example's LightningModule: a small character-level transformer language model (GPT-style: token and position
embeddings, pre-norm causal self-attention blocks, a linear head), on the engine's training recipe (AdamW groups,
per-step warmup-cosine, clipping with its diagnostics, the NaN stop: see engine/training/recipe.py).

Metric names: train/loss, lr, train/grad_norm, train/clip_share (written by the recipe), val/loss, val/perplexity,
test/loss, test/perplexity. `predict` continues each prompt with `sample_chars` sampled characters.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.text import Perplexity

from ..engine import TrainingRecipe, UsageError


class CharTransformer(TrainingRecipe):
    """Predicts the next character of a window of text.

    Args:
        vocabulary: the characters the model knows, in token order; left at None, the CLI takes it from the
            DataModule. Kept in the checkpoint, so `predict` decodes without the data.
        block_size: the longest window (the context length); left at None, the CLI takes it from the DataModule.
        width: the embedding width.
        layers: transformer blocks.
        heads: attention heads per block.
        dropout: dropout in the blocks.
        sample_chars: characters `predict` samples after each prompt.
        temperature: sampling temperature (lower: more likely characters).
        recipe: the training recipe's options (lr, betas, warmup, decay_steps, ...): TrainingRecipe's arguments.
    """

    def __init__(
        self,
        vocabulary: str | None = None,
        block_size: int | None = None,
        width: int = 64,
        layers: int = 2,
        heads: int = 4,
        dropout: float = 0.1,
        sample_chars: int = 200,
        temperature: float = 0.8,
        **recipe,
    ) -> None:
        super().__init__(**recipe)
        if vocabulary is None or block_size is None:
            raise UsageError("CharTransformer needs vocabulary and block_size (the CLI takes them from the data)")
        self.save_hyperparameters()
        self.embed = nn.Embedding(len(vocabulary), width)
        self.position = nn.Embedding(block_size, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, len(vocabulary))
        self.val_perplexity, self.test_perplexity = Perplexity(), Perplexity()
        # A sample input of forward: the model summary's sizes and FLOPs, the input of `export`.
        self.example_input_array = torch.randint(len(vocabulary), (2, block_size),
                                                 generator=torch.Generator().manual_seed(0))  # fmt: skip

    def forward(self, ids: Tensor) -> Tensor:
        """Next-character logits for every position of `ids` (batch, length), each seeing only what precedes it."""
        length = ids.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=ids.device)
        x = self.embed(ids) + self.position(torch.arange(length, device=ids.device))
        return self.head(self.norm(self.blocks(x, mask=causal, is_causal=True)))

    def _loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._loss(self(batch["x"]), batch["y"])  # logged by the recipe as train/loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits = self(batch["x"])
        self.val_perplexity.update(logits, batch["y"])
        self.log("val/loss", self._loss(logits, batch["y"]), prog_bar=True, sync_dist=True)
        self.log("val/perplexity", self.val_perplexity, prog_bar=True)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits = self(batch["x"])
        self.test_perplexity.update(logits, batch["y"])
        self.log("test/loss", self._loss(logits, batch["y"]), sync_dist=True)
        self.log("test/perplexity", self.test_perplexity)

    @torch.no_grad()
    def predict_step(self, prompt: Tensor, batch_idx: int) -> list[str]:
        """The prompt (a batch of one) continued with `sample_chars` characters, sampled with `temperature` from a
        generator seeded with the prompt's index: the same text on every call."""
        generator = torch.Generator(device=prompt.device).manual_seed(batch_idx)
        ids = prompt
        for _ in range(self.hparams.sample_chars):
            logits = self(ids[:, -self.hparams.block_size :])[:, -1] / self.hparams.temperature
            next_id = torch.multinomial(logits.softmax(-1), 1, generator=generator)
            ids = torch.cat([ids, next_id], dim=1)
        return ["".join(self.hparams.vocabulary[i] for i in row) for row in ids.tolist()]
