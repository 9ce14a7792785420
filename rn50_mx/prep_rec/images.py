"""What the packers and verify ask of an image's bytes: is it an image, is it one of ImageNet's odd files, does
it decode."""
import io

from PIL import Image, UnidentifiedImageError

from ..errors import InputError

JPEG_SOI = b"\xff\xd8\xff"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMAGE_EXTS = (".jpeg", ".jpg", ".png")
ODD_QUALITY = 100  # the MLPerf reference's preprocessing re-encodes the odd files as RGB JPEG at quality 100


def checked(data, name):
    """`data` if it starts like a JPEG or PNG (a full decode would cost more than the copy; verify decodes
    every image), else an InputError naming `name`."""
    if not data.startswith((JPEG_SOI, PNG_SIGNATURE)):
        raise InputError(f"{name}: not a JPEG or PNG image ({len(data)} bytes)")
    return data


def odd_kind(data):
    """Why ImageNet's preprocessing re-encodes these bytes ("PNG", "CMYK JPEG"), or None for a JPEG kept as it
    is (grayscale included: the decoders make RGB of it). Told by the bytes, not by a list of names."""
    if data.startswith(PNG_SIGNATURE):
        return "PNG"
    return "CMYK JPEG" if jpeg_components(data) == 4 else None


def jpeg_components(data):
    """The colour components of a JPEG's frame (1 gray, 3 YCbCr or RGB, 4 CMYK or YCCK), or None without a
    frame header. It walks the marker segments to the first start-of-frame (SOF0-SOF15 but DHT, JPG and DAC),
    whose 10th byte is the count: Pillow's open() tells the same by its mode, but parses every table on the way
    in Python, which was 40% of the CPU time per packed image."""
    i = 2
    while i + 9 < len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:  # a fill byte before the marker
            i += 1
        elif 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return data[i + 9]
        else:
            i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def as_rgb_jpeg(data, name):
    """The image re-encoded as an RGB JPEG at the reference's quality, or an InputError naming `name`."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            out = io.BytesIO()
            img.convert("RGB").save(out, "JPEG", quality=ODD_QUALITY)
            return out.getvalue()
    except Exception as err:  # Pillow raises OSError, SyntaxError, ValueError... for corrupt data
        raise InputError(f"{name}: cannot re-encode as RGB JPEG ({err})") from None


def decode_problem(data):
    """Why the image bytes do not decode, or None. JPEGs decode at 1/8 scale (draft; at least one pixel: a
    request of 0x0 would fail on a good tiny image): every byte of the entropy-coded data is still read, so
    truncation and corruption are still caught, at a fraction of the cost."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
    except UnidentifiedImageError:
        return f"the {len(data)} image bytes are not an image"
    except Exception as err:  # Pillow raises OSError, SyntaxError, ValueError... for corrupt data
        return f"image does not decode ({err})"
    return None
