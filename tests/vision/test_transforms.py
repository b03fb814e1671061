"""fastload.vision.transforms: torchvision's parameters, sizes, sampling rules and reprs.

Expected sizes and boxes are worked out by hand from torchvision's rules.
"""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest
from PIL import Image

from fastload.rng import seed_transform_rng, transform_rng
from fastload.vision import transforms as T
from fastload.cli import synthetic_image


def photo(width=50, height=30, seed=0, mode="RGB"):
    return Image.fromarray(synthetic_image(width, height, np.random.default_rng(seed))).convert(mode)


def pixels(img):
    return np.asarray(img)


# -- Resize ---------------------------------------------------------------


@pytest.mark.parametrize("kwargs, image_size, expected", [
    ({"size": 256}, (500, 375), (341, 256)),            # 256 * 500 / 375 = 341.3 -> 341
    ({"size": 256}, (375, 500), (256, 341)),            # portrait: width is the short side
    ({"size": [256]}, (500, 375), (341, 256)),          # [n] is the same as n
    ({"size": (100, 60)}, (500, 375), (60, 100)),       # (h, w)
    ({"size": 256, "max_size": 300}, (500, 375), (300, 225)),  # 341 > 300: 300 * 256 / 341 = 225.2
    ({"size": 256, "max_size": 400}, (500, 375), (341, 256)),  # cap not reached
    ({"size": None, "max_size": 100}, (500, 375), (100, 75)),  # longer edge = max_size
    ({"size": 10}, (33, 33), (10, 10)),
])
def test_resize_output_size(kwargs, image_size, expected):
    resize = T.Resize(**kwargs)
    assert resize.output_size(*image_size) == expected
    out = resize(photo(*image_size))
    assert out.size == expected and out.mode == "RGB"


def test_resize_is_pillows_resize_and_keeps_an_image_already_at_size():
    img = photo(120, 90)
    for mode, code in [(T.InterpolationMode.BILINEAR, Image.Resampling.BILINEAR),
                       (T.InterpolationMode.BICUBIC, Image.Resampling.BICUBIC),
                       (T.InterpolationMode.NEAREST, Image.Resampling.NEAREST)]:
        assert np.array_equal(pixels(T.Resize(45, interpolation=mode)(img)),
                              pixels(img.resize((60, 45), code)))
    assert T.Resize(90)(img) is img


def test_resize_validation():
    with pytest.raises(TypeError, match="Size should be int or sequence"):
        T.Resize("256")
    with pytest.raises(TypeError, match="Size should be int or sequence"):
        T.Resize(2.5)
    with pytest.raises(ValueError, match="1 or 2 values"):
        T.Resize((1, 2, 3))
    with pytest.raises(ValueError, match="max_size = 256 must be strictly greater"):
        T.Resize(256, max_size=256)
    with pytest.raises(ValueError, match="max_size should only be passed"):
        T.Resize((200, 100), max_size=300)
    with pytest.raises(ValueError, match="max_size must be provided"):
        T.Resize(None)
    with pytest.raises(TypeError, match="PIL image"):
        T.Resize(10)(np.zeros((3, 20, 20), np.uint8))
    with pytest.warns(UserWarning, match="antialias"):
        T.Resize(10, antialias=False)


def test_interpolation_accepts_names_and_pillow_codes():
    assert T.Resize(8, interpolation="bicubic").interpolation is T.InterpolationMode.BICUBIC
    assert T.Resize(8, interpolation=0).interpolation is T.InterpolationMode.NEAREST
    assert T.Resize(8, interpolation=Image.Resampling.LANCZOS).interpolation is T.InterpolationMode.LANCZOS
    with pytest.raises(TypeError, match="interpolation must be"):
        T.Resize(8, interpolation="sideways")
    with pytest.raises(KeyError, match="not a Pillow filter code"):  # torchvision: KeyError(7)
        T.Resize(8, interpolation=7)


# -- CenterCrop -----------------------------------------------------------


def test_center_crop_inside_the_image():
    img = photo(10, 7)
    out = T.CenterCrop(4)(img)
    # top = round((7 - 4) / 2) = round(1.5) = 2 (banker's rounding), left = round(3.0) = 3
    assert out.size == (4, 4)
    assert np.array_equal(pixels(out), pixels(img)[2:6, 3:7])
    out = T.CenterCrop((5, 2))(img)  # (h, w)
    assert np.array_equal(pixels(out), pixels(img)[1:6, 4:6])  # top round(1.0)=1, left round(4.0)=4


def test_center_crop_larger_than_the_image_pads_with_zeros():
    img = photo(5, 4)
    out = pixels(T.CenterCrop((7, 8))(img))
    # pad left (8-5)//2 = 1, right 2; top (7-4)//2 = 1, bottom 2
    assert out.shape == (7, 8, 3)
    assert np.array_equal(out[1:5, 1:6], pixels(img))
    assert out[0].sum() == 0 and out[5:].sum() == 0 and out[:, 0].sum() == 0 and out[:, 6:].sum() == 0
    # Padded in one direction, cropped in the other.
    out = pixels(T.CenterCrop((6, 3))(img))
    assert np.array_equal(out[1:5], pixels(img)[:, 1:4]) and out[0].sum() == 0 and out[5].sum() == 0


@pytest.mark.parametrize("mode", ["P", "PA"])
def test_center_crop_padding_keeps_the_palette(mode):
    img = photo(5, 4, mode=mode)
    out = T.CenterCrop((7, 8))(img)
    assert out.mode == mode and out.getpalette() == img.getpalette()
    assert np.array_equal(pixels(out.convert("RGBA"))[1:5, 1:6], pixels(img.convert("RGBA")))


def test_center_crop_on_arrays_matches_pil():
    img = photo(9, 6)
    chw = np.ascontiguousarray(pixels(img).transpose(2, 0, 1))
    for size in (4, (3, 5), (8, 12), (6, 9)):
        expected = pixels(T.CenterCrop(size)(img)).transpose(2, 0, 1)
        assert np.array_equal(T.CenterCrop(size)(chw), expected), size


def test_center_crop_validation_and_repr():
    with pytest.raises(ValueError, match="Please provide only two dimensions"):
        T.CenterCrop((1, 2, 3))
    assert repr(T.CenterCrop(224)) == "CenterCrop(size=(224, 224))"
    assert T.CenterCrop([5]).size == (5, 5)


# -- RandomResizedCrop -----------------------------------------------------


def test_random_resized_crop_params_respect_scale_and_ratio():
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    width, height = 500, 375
    # A PIL image and a (C, H, W) array of the same size give the same draws.
    seed_transform_rng(0, 0)
    from_pil = T.RandomResizedCrop.get_params(photo(width, height), scale, ratio)
    seed_transform_rng(0, 0)
    assert T.RandomResizedCrop.get_params(np.empty((3, height, width)), scale, ratio) == from_pil
    for _ in range(2000):
        top, left, h, w = T.RandomResizedCrop.get_params(np.empty((3, height, width)), scale, ratio)
        assert 0 < w <= width and 0 < h <= height
        assert 0 <= top <= height - h and 0 <= left <= width - w
        # Rounding to whole pixels moves area and ratio a little off the sampled values.
        assert scale[0] * width * height * 0.95 - 2 * (w + h) <= w * h <= width * height
        assert ratio[0] - 1.5 / h <= w / h <= ratio[1] + 1.5 / h


def test_random_resized_crop_falls_back_to_a_central_crop_clamped_to_ratio():
    impossible = (2.0, 3.0)  # every try asks for more than the whole image
    ratio = (3 / 4, 4 / 3)
    wide = np.empty((1, 10, 100))
    tall = np.empty((1, 100, 10))
    square = np.empty((1, 40, 40))
    assert T.RandomResizedCrop.get_params(wide, impossible, ratio) == (0, 43, 10, 13)   # w = round(10 * 4/3)
    assert T.RandomResizedCrop.get_params(tall, impossible, ratio) == (43, 0, 13, 10)   # h = round(10 / 0.75)
    assert T.RandomResizedCrop.get_params(square, impossible, ratio) == (0, 0, 40, 40)


def test_random_resized_crop_uses_ten_tries_of_two_draws_before_falling_back():
    seed_transform_rng(9, 9)
    T.RandomResizedCrop.get_params(np.empty((1, 10, 10)), (2.0, 3.0), (1.0, 1.0))
    after_fallback = transform_rng().bit_generator.state
    seed_transform_rng(9, 9)
    for _ in range(20):
        transform_rng().uniform(0, 1)
    assert transform_rng().bit_generator.state == after_fallback


def test_random_resized_crop_output_and_pixels():
    img = photo(80, 60)
    crop = T.RandomResizedCrop((30, 20), scale=(0.2, 0.9))
    seed_transform_rng(1, 1)
    out = crop(img)
    assert out.size == (20, 30)
    seed_transform_rng(1, 1)
    top, left, h, w = T.RandomResizedCrop.get_params(img, crop.scale, crop.ratio)
    expected = img.crop((left, top, left + w, top + h)).resize((20, 30), Image.Resampling.BILINEAR)
    assert np.array_equal(pixels(out), pixels(expected))


def test_random_resized_crop_is_deterministic_per_seed():
    img = photo(64, 48)
    crop = T.RandomResizedCrop(16)
    seed_transform_rng(123, 4)
    first = [pixels(crop(img)) for _ in range(5)]
    seed_transform_rng(123, 4)
    again = [pixels(crop(img)) for _ in range(5)]
    seed_transform_rng(123, 5)
    other = [pixels(crop(img)) for _ in range(5)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_random_resized_crop_validation_and_repr():
    with pytest.raises(TypeError, match="Scale should be a sequence"):
        T.RandomResizedCrop(10, scale=0.5)
    with pytest.raises(TypeError, match="Ratio should be a sequence"):
        T.RandomResizedCrop(10, ratio=1.0)
    with pytest.warns(UserWarning, match=r"Scale and ratio should be of kind \(min, max\)"):
        T.RandomResizedCrop(10, scale=(1.0, 0.5))
    assert repr(T.RandomResizedCrop(224)) == (
        "RandomResizedCrop(size=(224, 224), scale=(0.08, 1.0), ratio=(0.75, 1.3333), "
        "interpolation=bilinear, antialias=True)")


# -- RandomHorizontalFlip ---------------------------------------------------


def test_flip_mirrors_pil_and_arrays():
    img = photo(7, 5)
    flipped = pixels(T.RandomHorizontalFlip(p=1.0)(img))
    assert np.array_equal(flipped, pixels(img)[:, ::-1])
    assert T.RandomHorizontalFlip(p=0.0)(img) is img
    chw = np.ascontiguousarray(pixels(img).transpose(2, 0, 1))
    out = T.RandomHorizontalFlip(p=1.0)(chw)
    assert np.array_equal(out, chw[..., ::-1]) and out.flags.c_contiguous
    with pytest.raises(TypeError, match="RandomHorizontalFlip takes"):
        T.RandomHorizontalFlip(p=1.0)([1, 2, 3])


def test_flip_draws_once_per_call_and_flips_about_half():
    flip = T.RandomHorizontalFlip()
    img = photo(4, 3)
    seed_transform_rng(0, 0)
    flips = [flip(img) is not img for _ in range(2000)]
    assert 900 < sum(flips) < 1100
    seed_transform_rng(0, 0)
    expected = [transform_rng().random() < 0.5 for _ in range(2000)]
    assert flips == expected
    assert repr(flip) == "RandomHorizontalFlip(p=0.5)"


def test_transforms_never_touch_global_random_state():
    random.seed(1)
    np.random.seed(1)
    python_state, numpy_state = random.getstate(), np.random.get_state()[1].copy()
    pipeline = T.Compose([T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.ToArray()])
    for _ in range(20):
        pipeline(photo(20, 20))
    assert random.getstate() == python_state
    assert np.array_equal(np.random.get_state()[1], numpy_state)


# -- ToArray and Normalize --------------------------------------------------


def test_to_array_gives_contiguous_uint8_chw():
    img = photo(6, 4)
    out = T.ToArray()(img)
    assert out.shape == (3, 4, 6) and out.dtype == np.uint8 and out.flags.c_contiguous
    assert np.array_equal(out, pixels(img).transpose(2, 0, 1))
    gray = T.ToArray()(img.convert("L"))
    assert gray.shape == (1, 4, 6) and gray.dtype == np.uint8
    rgba = T.ToArray()(img.convert("RGBA"))
    assert rgba.shape == (4, 4, 6)
    assert np.array_equal(T.ToArray()(pixels(img)), out)  # an HWC array is accepted too
    assert repr(T.ToArray()) == "ToArray()"
    with pytest.raises(TypeError, match="ToArray takes"):
        T.ToArray()("image.jpg")


def test_normalize_float_input_as_torchvision():
    rng = np.random.default_rng(0)
    x = rng.random((3, 4, 5), dtype=np.float32)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    out = T.Normalize(mean, std)(x)
    expected = (x - np.array(mean, np.float32)[:, None, None]) / np.array(std, np.float32)[:, None, None]
    assert out.dtype == np.float32 and np.allclose(out, expected, atol=1e-6)
    assert out is not x
    batch = np.stack([x, x])
    assert np.allclose(T.Normalize(mean, std)(batch)[1], expected, atol=1e-6)
    inplace = x.copy()
    assert T.Normalize(mean, std, inplace=True)(inplace) is inplace
    assert np.allclose(inplace, expected, atol=1e-6)
    assert T.Normalize(0.5, 0.25)(x.astype(np.float64)).dtype == np.float64


def test_normalize_uint8_input_scales_to_unit_range_first():
    chw = T.ToArray()(photo(8, 6))
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    out = T.Normalize(mean, std)(chw)
    expected = (chw / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    assert out.dtype == np.float32 and out.shape == chw.shape
    assert np.allclose(out, expected, atol=1e-5)


def test_normalize_uint8_is_bit_for_bit_torchvisions_to_tensor_then_normalize(torch):
    # ToTensor: img.to(float32).div(255); Normalize: tensor.sub_(mean).div_(std)
    # with mean and std as float32 tensors viewed (-1, 1, 1).
    chw = np.arange(256 * 3, dtype=np.uint8).reshape(3, 16, 16)
    for mean, std in [((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), ((0.5,), (0.5,))]:
        theirs = torch.from_numpy(chw).to(dtype=torch.float32).div(255)
        theirs.sub_(torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1))
        theirs.div_(torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1))
        ours = T.Normalize(mean, std)(chw)
        assert ours.dtype == np.float32
        assert np.array_equal(ours, theirs.numpy()), np.abs(ours - theirs.numpy()).max()


def test_normalize_validation_and_repr():
    x = np.zeros((3, 2, 2), np.float32)
    with pytest.raises(ValueError, match="std evaluated to zero"):
        T.Normalize([0, 0, 0], [1, 0, 1])(x)
    with pytest.raises(TypeError, match="float or uint8"):
        T.Normalize([0], [1])(x.astype(np.int16))
    with pytest.raises(TypeError, match="put ToArray"):
        T.Normalize([0], [1])(photo())
    # torchvision's types: ValueError for a 2-D image, TypeError below that,
    # RuntimeError (torch's broadcasting) for a mean/std of the wrong length.
    with pytest.raises(ValueError, match=r"\(\.\.\., C, H, W\)"):
        T.Normalize([0], [1])(np.zeros((2, 2), np.float32))
    with pytest.raises(TypeError, match=r"\(\.\.\., C, H, W\)"):
        T.Normalize([0], [1])(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="float or uint8"):  # the dtype before the 2-D check
        T.Normalize([0], [1])(np.zeros((2, 2), np.int32))
    with pytest.raises(RuntimeError, match="has 3 channels"):
        T.Normalize([0, 0], [1, 1])(x)
    assert repr(T.Normalize([0.5], [0.2])) == "Normalize(mean=[0.5], std=[0.2])"


@pytest.mark.parametrize("mean, std, error, message", [
    (None, [1.0], TypeError, "mean should be numbers, but got None"),
    ([0.5], None, TypeError, "std should be numbers, but got None"),
    ([0.5, "a", 0.2], [1.0], TypeError, "mean should be numbers"),
    ([[0.1, 0.2, 0.3]], [1.0], RuntimeError, r"mean should be one number or one per channel, "
                                             r"but got shape \(1, 3\)"),
    ([0.5], [[1.0], [2.0], [3.0]], RuntimeError, r"std .* shape \(3, 1\)")])
def test_normalize_refuses_a_mean_or_std_that_is_not_per_channel_numbers(mean, std, error, message):
    # torchvision: TypeError (not numbers) or its broadcasting's RuntimeError;
    # never NaNs (None) or a silent reshape of a 2-D mean.
    for dtype in (np.float32, np.uint8):
        with pytest.raises(error, match=message):
            T.Normalize(mean, std)(np.ones((3, 4, 3), dtype))


def test_normalize_takes_a_scalar_or_a_tensor_mean(torch):
    x = np.full((3, 2, 2), 1.0, np.float32)
    assert np.array_equal(T.Normalize(0.5, 0.25)(x), np.full((3, 2, 2), 2.0, np.float32))
    got = T.Normalize(torch.tensor([0.5, 0.0, 1.0]), [0.5])(x)
    assert got[:, 0, 0].tolist() == [1.0, 2.0, 0.0]


def test_sizes_are_taken_as_torchvision_takes_them():
    img = photo(64, 48)
    assert T.CenterCrop(np.array([10, 20]))(img).size == (20, 10)  # anything with two items
    assert T.RandomResizedCrop(np.array([12, 8]))(img).size == (8, 12)
    for make in (T.CenterCrop, T.RandomResizedCrop):
        with pytest.raises(TypeError, match="size=None"):  # torchvision: TypeError (len(None))
            make(None)
        with pytest.raises(ValueError):
            make((1, 2, 3))


def test_random_resized_crop_with_bad_scale_or_ratio_fails_naming_them():
    img = photo(64, 48)
    for scale, ratio in (((1.0, 0.08), (0.75, 1.33)), ((0.08, 1.0), (1.33, 0.75)),
                         ((0.08, 1.0), (0.0, 1.0)), ((0.08, 1.0), (-1.0, 1.0))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (min, max) order is warned about at construction
            crop = T.RandomResizedCrop(8, scale=scale, ratio=ratio)
        with pytest.raises(RuntimeError, match=r"scale=.*ratio="):  # torchvision: RuntimeError
            crop(img)
    # torchvision reads the first two values of a longer scale.
    assert T.RandomResizedCrop(8, scale=(0.5, 1.0, 7.0))(img).size == (8, 8)


# -- Compose ----------------------------------------------------------------


def test_compose_chains_and_reprs_like_torchvision():
    pipeline = T.Compose([T.Resize(20), T.CenterCrop(16), T.ToArray()])
    out = pipeline(photo(40, 30))
    assert out.shape == (3, 16, 16)
    assert repr(pipeline) == (
        "Compose(\n"
        "    Resize(size=20, interpolation=bilinear, max_size=None, antialias=True)\n"
        "    CenterCrop(size=(16, 16))\n"
        "    ToArray()\n"
        ")")


def test_standard_training_pipeline_shapes():
    pipeline = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToArray(),
                          T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    seed_transform_rng(0, 0)
    for seed in range(5):
        out = pipeline(photo(500, 375, seed=seed))
        assert out.shape == (3, 224, 224) and out.dtype == np.float32
        assert math.isfinite(float(out.sum()))


# -- the fused resize (fastload.vision.resample) ----------------------------

_FILTERS = [Image.Resampling.LANCZOS, Image.Resampling.BILINEAR, Image.Resampling.BICUBIC,
            Image.Resampling.BOX, Image.Resampling.HAMMING]


def test_the_installed_pillows_pass_order_is_known():
    import PIL

    from fastload.vision.resample import pass_order

    # Without a known rule the fused path is off (correct, only slower): say so loudly.
    assert pass_order() is not None, (
        f"Pillow {PIL.__version__} orders its two resize passes in a way no known rule "
        f"reproduces: add its rule to fastload.vision.resample._KNOWN_ORDERS")


@pytest.mark.parametrize("resample", _FILTERS, ids=lambda f: f.name)
def test_resize_to_chw_is_pillows_resize_flip_and_to_array_bit_for_bit(resample):
    from fastload.vision.resample import resize_to_chw

    rng = np.random.default_rng(int(resample))
    for case in range(150):
        width, height = (int(v) for v in rng.integers(1, 90, 2))
        out_width, out_height = (int(v) for v in rng.integers(1, 90, 2))
        if case % 7 == 0:   # one axis unchanged: Pillow skips that pass
            out_width = width
        if case % 11 == 0:
            out_height = height
        if case % 2:
            img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        else:
            img = photo(width, height, seed=case)
        box = None
        if case % 3 == 1:   # a float box, as a reduced-size decode uses
            left, top = rng.uniform(0, width - 0.5), rng.uniform(0, height - 0.5)
            box = (float(left), float(top), float(rng.uniform(left + 0.1, width)),
                   float(rng.uniform(top + 0.1, height)))
        flip = bool(case % 4 < 2)
        expected = img.resize((out_width, out_height), resample, box=box)
        if flip:
            expected = expected.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        got = resize_to_chw(img, (out_width, out_height), resample, box=box, flip=flip)
        assert got.flags.c_contiguous and got.dtype == np.uint8
        assert np.array_equal(got, T.ToArray()(expected)), (case, img.size, box, flip)


def test_resize_to_chw_refuses_what_it_cannot_reproduce():
    from fastload.vision.resample import fusable, resize_to_chw

    assert fusable("RGB", Image.Resampling.BILINEAR)
    assert not fusable("L", Image.Resampling.BILINEAR)
    assert not fusable("RGBA", Image.Resampling.BILINEAR)
    assert not fusable("RGB", Image.Resampling.NEAREST)
    with pytest.raises(ValueError, match="fusable"):
        resize_to_chw(photo(mode="L"), (10, 10), Image.Resampling.BILINEAR)


def test_resample_rows_names_what_is_wrong():
    from fastload import _core

    src = np.zeros((8, 12), dtype=np.uint8)
    with pytest.raises(ValueError, match="resample=0"):
        _core.resample_rows(src, 0, 8, np.zeros((4, 12), dtype=np.uint8), 0)
    with pytest.raises(ValueError, match="12 columns and out 10"):
        _core.resample_rows(src, 0, 8, np.zeros((4, 10), dtype=np.uint8), 2)
    with pytest.raises(ValueError, match="not inside 0..8"):
        _core.resample_rows(src, 2, 9, np.zeros((4, 12), dtype=np.uint8), 2)
