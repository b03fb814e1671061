"""Image folders, classic datasets and transforms: the parts of torchvision that image ingest needs.

``ImageFolder`` / ``DatasetFolder`` follow torchvision's layout, ordering and
attributes with a compact numpy sample table; ``MNIST``, ``FashionMNIST``,
``CIFAR10`` and ``CIFAR100`` read torchvision's files (and download them);
``fastload.vision.transforms`` has torchvision's basic transforms on PIL
images and numpy arrays.
"""

from . import transforms
from .cifar import CIFAR10, CIFAR100
from .folder import (
    IMG_EXTENSIONS,
    DatasetFolder,
    ImageFolder,
    default_loader,
    find_classes,
    has_file_allowed_extension,
    is_image_file,
    make_dataset,
    pil_loader,
)
from .mnist import MNIST, FashionMNIST
from .sample_table import SampleTable, TargetList
from .vision import VisionDataset

__all__ = [
    "DatasetFolder",
    "ImageFolder",
    "IMG_EXTENSIONS",
    "default_loader",
    "pil_loader",
    "find_classes",
    "make_dataset",
    "has_file_allowed_extension",
    "is_image_file",
    "SampleTable",
    "TargetList",
    "transforms",
    "VisionDataset",
    "MNIST",
    "FashionMNIST",
    "CIFAR10",
    "CIFAR100",
]
