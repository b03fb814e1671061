"""``VisionDataset``: torchvision's base of the folder and classic datasets (root,
transforms, repr), and ``StandardTransform``, its pairing of the two transforms."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..dataset import Dataset

__all__ = ["VisionDataset", "StandardTransform"]


class VisionDataset(Dataset):
    """A dataset stored under ``root``, with torchvision's transform attributes and ``repr``.

    ``transforms`` (one callable on ``(input, target)``) is exclusive with
    ``transform`` / ``target_transform``; given these, ``transforms`` becomes
    their ``StandardTransform``, as in torchvision.
    """

    _repr_indent = 4

    def __init__(self, root: str | os.PathLike | None = None,
                 transforms: Callable | None = None,
                 transform: Callable | None = None,
                 target_transform: Callable | None = None) -> None:
        if isinstance(root, str):
            root = os.path.expanduser(root)
        self.root = root
        separate = transform is not None or target_transform is not None
        if transforms is not None and separate:
            raise ValueError("Only transforms or transform/target_transform can be passed as argument")
        self.transform = transform
        self.target_transform = target_transform
        if separate:
            transforms = StandardTransform(transform, target_transform)
        self.transforms = transforms

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        body = [f"Number of datapoints: {self.__len__()}"]
        if self.root is not None:
            body.append(f"Root location: {self.root}")
        body += self.extra_repr().splitlines()
        if getattr(self, "transforms", None) is not None:
            body.append(repr(self.transforms))
        indent = " " * self._repr_indent
        return "\n".join([f"Dataset {self.__class__.__name__}"] + [indent + line for line in body])


class StandardTransform:
    """torchvision's pairing of a sample transform and a target transform:
    ``(input, target) -> (transform(input), target_transform(target))``."""

    def __init__(self, transform: Callable | None = None,
                 target_transform: Callable | None = None) -> None:
        self.transform = transform
        self.target_transform = target_transform

    def __call__(self, input: Any, target: Any) -> tuple[Any, Any]:
        if self.transform is not None:
            input = self.transform(input)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return input, target

    def __repr__(self) -> str:
        body = [self.__class__.__name__]
        for head, transform in (("Transform: ", self.transform),
                                ("Target transform: ", self.target_transform)):
            if transform is not None:
                lines = repr(transform).splitlines()
                body += [head + lines[0]] + [" " * len(head) + line for line in lines[1:]]
        return "\n".join(body)
