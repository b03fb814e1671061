# cython: language_level=3
"""fastload's hot loops, compiled.

Split by concept into include files in ``_kernels/`` so each reads on its
own, but built as one extension module so the kernels share a single import:

* ``_shared.pxi``, included first: what more than one kernel uses, written
  once (numpy's dimension limit, prefetching, a gather's row check).
* ``_random.pxi``: the PRNG and the index streams (permutation, bounded
  draws); ``_weighted.pxi``, after it: weighted draws (alias tables).
* ``_copy.pxi``: moving bytes: row gather for ArrayDataset and the
  collate-into-buffer copies.
* ``_resample.pxi``: one pass of Pillow's antialiased resize, bit for bit
  (the image pipeline's hot loop).
* ``_resample_packed.pxi``: Pillow's whole resize from packed pixels in place
  (stored RGB, RGBX) to the channel-first output.
* ``_pillow_pixels.pxi``: an RGB image's pixels out of Pillow in one copy
  (the decoded-image cache's fill).
* ``_text.pxi``: a batch's strings joined for the result pipe.
* ``_plan_key.pxi``: the key under which a batch's planned layout is kept.
* ``_views.pxi``: zero-copy arrays over a ring slot, for the batches the
  main process hands out.
* ``_pad.pxi``: variable-length leaves padded into a batch (pad_collate);
  included after ``_copy.pxi``, whose leaf checks and copies it uses.
* ``_chunks.pxi``: the gather over a column held in several arrays (an
  Arrow column's record batches), and ragged rows padded from them;
  after ``_pad.pxi``, whose padding fill it uses.
* ``_buckets.pxi``: length-sorted samples packed into batches by a token
  budget (BucketBatchSampler).
* ``_image_rows.pxi``: whole batches of in-memory images (MNIST, CIFAR) as
  ``ToArray()`` and ``Normalize`` would make them.
"""

include "_kernels/_shared.pxi"
include "_kernels/_random.pxi"
include "_kernels/_weighted.pxi"
include "_kernels/_copy.pxi"
include "_kernels/_pad.pxi"
include "_kernels/_chunks.pxi"
include "_kernels/_buckets.pxi"
include "_kernels/_resample.pxi"
include "_kernels/_resample_packed.pxi"
include "_kernels/_pillow_pixels.pxi"
include "_kernels/_text.pxi"
include "_kernels/_plan_key.pxi"
include "_kernels/_views.pxi"
include "_kernels/_image_rows.pxi"
