"""Data where users keep it: Arrow and Parquet files, WebDataset tar shards, image columns.

An optional part of fastload (``pip install fastload[sources]``: pyarrow,
datasets, fsspec); ``import fastload`` never imports it.  The DataLoader
imports ``fastload.sources.hugging_face`` only when given a Hugging Face
``datasets.Dataset``.
"""

from fastload.sources.arrow import ArrowDataset
from fastload.sources.image_columns import ImageColumnTransform
from fastload.sources.parquet import ParquetDataset
from fastload.sources.shard_stream import ShardStream
from fastload.sources.tar_shards import TarShards

__all__ = ["ArrowDataset", "ParquetDataset", "TarShards", "ShardStream", "ImageColumnTransform"]
