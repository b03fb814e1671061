"""Typed signatures of fastload._core (the compiled kernels)."""

from typing import Any

import numpy as np
import numpy.typing as npt

# --- index streams (_random.pxi) ---
# Every stream is a pure function of its arguments and a seed in [0, 2**64):
# xoshiro256** seeded by SplitMix64, identical on every platform.

def random_raw(count: int, seed: int) -> npt.NDArray[np.uint64]:
    """The first ``count`` raw outputs of xoshiro256** seeded by ``seed``."""

def uniform(count: int, seed: int) -> npt.NDArray[np.float64]:
    """``count`` doubles uniform on [0, 1) (top 53 bits of each output)."""

def permutation(n: int, seed: int) -> npt.NDArray[np.int64]:
    """A uniform random permutation of ``range(n)``."""

def permutation_stream(n: int, count: int, seed: int) -> npt.NDArray[np.int64]:
    """The first ``count`` indices of back-to-back permutations of ``range(n)``.

    ``permutation_stream(n, n, seed)`` equals ``permutation(n, seed)``.
    """

def randint(
    n: int, count: int, seed: int, out: npt.NDArray[np.int64] | None = None
) -> npt.NDArray[np.int64]:
    """``count`` unbiased uniform draws from ``range(n)`` (Lemire's method)."""

def alias_table(weights: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """Walker/Vose alias table, shape ``(n, 2)``: (53-bit threshold, alias) per column.

    Raises RuntimeError for negative / NaN / infinite weights or a zero sum,
    ValueError when ``weights`` is not 1-d.
    """

def alias_draw(
    table: npt.NDArray[np.uint64], count: int, seed: int, out: npt.NDArray[np.int64] | None = None
) -> npt.NDArray[np.int64]:
    """``count`` draws with replacement from an ``alias_table``, O(1) each."""

def weighted_sample(
    weights: npt.ArrayLike, count: int, replacement: bool, seed: int
) -> npt.NDArray[np.int64]:
    """``count`` indices drawn proportionally to ``weights``.

    Without replacement: distinct, never a zero weight, in draw order;
    RuntimeError if ``count`` exceeds the number of positive weights.
    """

# --- copy kernels (_copy.pxi) ---

COPY_OK: int
COPY_BAD_TYPE: int
COPY_BAD_DTYPE: int
COPY_BAD_SHAPE: int
COPY_OVERFLOW: int
SCALAR_INT: int
SCALAR_FLOAT: int
SCALAR_BOOL: int
SCALAR_NUMPY: int

def collate_array_leaf(
    samples: list[Any], path: tuple[Any, ...], dtype: np.dtype[Any], shape: tuple[int, ...],
    out: npt.NDArray[Any],
) -> tuple[int, int]:
    """Copy ``sample[path]`` (an ndarray of ``dtype``/``shape``) of every sample into ``out[i]``.

    Returns ``(-1, COPY_OK)`` or ``(i, reason)`` for the first sample it cannot take.
    """

def collate_scalar_leaf(
    samples: list[Any], path: tuple[Any, ...], kind: int, out: npt.NDArray[Any]
) -> tuple[int, int]:
    """Write the scalar ``sample[path]`` of every sample into ``out[i]`` (kind: SCALAR_*)."""

def collect_leaf_objects(samples: list[Any], path: tuple[Any, ...]) -> list[Any]:
    """``[sample[path] for sample in samples]``."""

def first_length_mismatch(samples: list[Any], path: tuple[Any, ...], expected: int) -> int:
    """Index of the first sample whose ``len(sample[path]) != expected``, else -1."""

def gather_rows(
    source: npt.NDArray[Any], rows: npt.NDArray[np.int64], out: npt.NDArray[Any]
) -> npt.NDArray[Any]:
    """``out[i] = source[rows[i]]``; IndexError naming a row out of range."""

# _image_rows.pxi
def gather_image_rows(
    source: npt.NDArray[np.uint8], rows: npt.NDArray[np.int64], out: npt.NDArray[Any],
    table: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[Any]:
    """``out[i] = ToArray()(source[rows[i]])`` (channels first), mapped through the
    per-channel ``(C, 256)`` float32 ``table`` when given; IndexError naming a row."""

# _resample.pxi
RESAMPLE_FILTERS: frozenset[int]

def resample_rows(
    src: npt.NDArray[np.uint8], start: float, stop: float, out: npt.NDArray[np.uint8],
    resample: int,
) -> None:
    """One pass of Pillow's resize along the first axis of a 2-D byte array, bit for bit:
    rows ``start..stop`` of ``src`` to ``out.shape[0]`` rows (same number of columns)."""

# _text.pxi
def join_strings(items: Any) -> str | None:
    """``"\\0".join(items)`` when ``items`` is a non-empty list or tuple of exact ``str``
    without NUL characters (so ``split("\\0")`` gives them back), else None."""

# _plan_key.pxi
def layout_key(sample: Any, keep: list[Any]) -> tuple[Any, ...] | None:
    """A hashable key equal for two samples exactly when ``default_collate`` lays their
    batches out alike, or None for a sample it cannot describe exactly (tensors,
    mapping subclasses, other objects); the dtypes it names by id are appended to
    ``keep``, which must outlive the key's use."""

# --- zero-copy arrays over a ring slot (_views.pxi) ---

def lease_array(lease: Any, memory: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """A uint8 array over ``memory``'s bytes (writeable if it is) whose base is ``lease``,
    which must keep that memory mapped; ValueError unless ``memory`` is contiguous bytes."""

def slot_view(buffer: npt.NDArray[np.uint8], dtype: np.dtype, shape: tuple[int, ...],
              offset: int) -> np.ndarray:
    """``np.ndarray(shape, dtype, buffer, offset)``: a C-contiguous view of a contiguous
    byte array, writeable if it is; ValueError if it does not fit."""

# --- padding variable-length leaves (_pad.pxi) ---

def measure_padded_leaf(
    samples: list, path: tuple, dtype: np.dtype, trailing: tuple
) -> tuple[list | None, npt.NDArray[np.int64] | None, int, int, int]:
    """``(leaves, lengths, longest, -1, COPY_OK)`` at ``path``, or ``(None, None, 0, i, reason)``."""

def pad_rows(
    leaves: list, out: np.ndarray, padding: np.ndarray, mask: np.ndarray | None = None
) -> np.ndarray:
    """Each leaf's rows at the head of its row of ``out``, the rest ``padding``; the mask too."""

# --- token-budget batches (_buckets.pxi) ---

def token_batch_starts(
    sorted_lengths: npt.NDArray[np.int64], chunk: int, batch_size: int, max_tokens: int
) -> npt.NDArray[np.int64]:
    """Where each greedy batch starts in chunk-wise ascending ``sorted_lengths``."""

# _chunks.pxi
class ChunkedRows:
    """C-contiguous arrays of one dtype and row shape, gathered as one array."""
    chunks: tuple[npt.NDArray[Any], ...]
    dtype: np.dtype[Any]
    row_shape: tuple[int, ...]
    length: int
    def __init__(self, chunks: Any, dtype: Any, row_shape: tuple[int, ...]) -> None: ...
    def __len__(self) -> int: ...
    def gather(self, rows: npt.NDArray[np.int64], out: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """``out[i]`` = global row ``rows[i]``; IndexError naming a row out of range."""

class RaggedRows:
    """Rows of differing lengths in several chunks, padded into a batch."""
    values: tuple[npt.NDArray[Any], ...]
    offsets: tuple[npt.NDArray[np.int64], ...]
    dtype: np.dtype[Any]
    item_shape: tuple[int, ...]
    length: int
    def __init__(self, values: Any, offsets: Any, dtype: Any, item_shape: tuple[int, ...]) -> None: ...
    def __len__(self) -> int: ...
    def lengths(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]: ...
    def gather_padded(self, rows: npt.NDArray[np.int64], out: npt.NDArray[Any],
                      padding: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """``out[i, :len]`` = row ``rows[i]``, then ``padding``; IndexError naming a row."""
