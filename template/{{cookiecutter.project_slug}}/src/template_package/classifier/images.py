"""Image files: decoded with the file named when that fails, the train and eval transforms of the ImageFolder
pipeline, and a folder of unlabeled images for `predict`. Depends on torch, torchvision and Pillow.
"""

from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..engine import UsageError

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


def load_rgb_image(path: str):
    """PIL's loader, with the file's path in the error when the image cannot be decoded."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as error:
        raise UsageError(f"cannot decode the image {path} ({error.__class__.__name__}): fix or delete it") from None


def image_folder_transforms(image_size: int):
    """(train, eval) transforms: random crops and flips for training only; eval resizes and center-crops."""
    from torchvision.transforms import v2

    to_tensor = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    train = v2.Compose([v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip(), *to_tensor])
    evaluate = v2.Compose([v2.Resize(round(image_size * 8 / 7), antialias=True), v2.CenterCrop(image_size), *to_tensor])
    return train, evaluate


def digits_like_transform():
    """New images for a model trained on digits: grayscale, 8x8, in [0, 1] like the digits (dark ink on white is
    inverted by the caller's data, not here)."""
    from torchvision.transforms import v2

    return v2.Compose([v2.Grayscale(), v2.Resize((8, 8), antialias=True), v2.ToImage(),
                       v2.ToDtype(torch.float32, scale=True)])  # fmt: skip


class ImageFiles(Dataset):
    """Every image file under `root` (nested folders too), in path order, as (image, -1): images without labels.

    `files` lists their paths, so predictions line up with them.
    """

    def __init__(self, root: str, transform) -> None:
        self.root, self.transform = Path(root), transform
        if not self.root.is_dir():
            raise UsageError(f"predict_dir={root!r} is not a folder: give a folder of images")
        self.files = sorted(str(p) for p in self.root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        if not self.files:
            raise UsageError(f"predict_dir={root!r} has no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        return self.transform(load_rgb_image(self.files[index])), -1
