#!/usr/bin/env python3
"""Dump raw quantized blocks of a GGUF file together with the PyPI `gguf`
package's numpy dequantization of them, for tests/quant_xcheck_test.cpp:

    python scripts/quant_xcheck.py MODEL.gguf /tmp/xcheck.bin [max_elems_per_tensor]
    python scripts/quant_xcheck.py --synthetic /tmp/xcheck.bin
    TANDEM_QUANT_XCHECK=/tmp/xcheck.bin ./build/tandem_tests --gtest_filter='QuantXcheck*'

--synthetic writes, instead of a model's tensors, blocks made here for the
formats gguf-py can also quantize (MXFP4): every E8M0 exponent with random
codes (dequantization), and float rows whose block maxima span the exponents,
with values on the codes' midpoints to meet the quantizer's tie rule
(quantization: gguf-py's bytes, which Tandem's quantize_row must equal).

Output: b"TQX2", then per record: u8 kind (0: dequantize, 1: quantize),
u32 ggml type, u64 element count n, u32 name length, name bytes, the raw
bytes of the n elements, n f32 values (the dequantization for kind 0, the
quantizer's input for kind 1); all little-endian.
"""
import struct
import sys

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize


def record(out, kind, qtype, name, raw, values):
    values = np.asarray(values, dtype="<f4").reshape(-1)
    out.write(struct.pack("<BIQI", kind, int(qtype), values.size, len(name)))
    out.write(name.encode())
    out.write(np.asarray(raw, dtype=np.uint8).tobytes())
    out.write(values.tobytes())


def model_tensors(out, src, limit):
    reader = GGUFReader(src)
    for t in reader.tensors:
        block_elems, block_bytes = GGML_QUANT_SIZES[t.tensor_type]
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        n = min(int(t.n_elements), limit)
        n -= n % block_elems
        nbytes = n // block_elems * block_bytes
        chunk = raw[:nbytes]
        values = dequantize(chunk.reshape(-1, block_bytes) if block_elems > 1 else chunk, t.tensor_type)
        values = np.asarray(values, dtype=np.float32).reshape(-1)
        assert values.size == n, (t.name, values.size, n)
        record(out, 0, t.tensor_type, t.name, chunk, values)


def synthetic(out):
    rng = np.random.default_rng(47)
    mx = GGMLQuantizationType.MXFP4
    block_elems, block_bytes = GGML_QUANT_SIZES[mx]
    # Every exponent byte, each with random codes.
    blocks = rng.integers(0, 256, size=(256, block_bytes), dtype=np.uint8)
    blocks[:, 0] = np.arange(256, dtype=np.uint8)
    record(out, 0, mx, "mxfp4 every exponent", blocks, dequantize(blocks, mx))
    # Rows of 64 blocks; block i's values are scaled by 2^(i - 40) (maxima
    # from 2^-40 to 2^23, some exactly powers of two), half of them random,
    # half on the midpoints between neighbouring codes (x.25, x.75, 2.5, 3.5, 5).
    n_blocks = 64
    x = rng.standard_normal((n_blocks, block_elems)).astype(np.float32)
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
    pick = rng.integers(0, len(mids), size=(n_blocks, block_elems // 2))
    sign = np.where(rng.integers(0, 2, size=pick.shape) == 1, -1.0, 1.0).astype(np.float32)
    x[:, : block_elems // 2] = mids[pick] * sign
    x[:, 0] = np.where(np.arange(n_blocks) % 2 == 0, 6.0, 4.0)  # the block's maximum: 2^2.58 or exactly 2^2
    x[3] = 0.0  # an all-zero block
    x *= np.exp2(np.arange(n_blocks, dtype=np.float32) - 40).reshape(-1, 1)
    x = x.astype(np.float32).reshape(-1)
    record(out, 1, mx, "mxfp4 quantize", quantize(x.reshape(1, -1), mx), x)


def main() -> None:
    if sys.argv[1] == "--synthetic":
        with open(sys.argv[2], "wb") as out:
            out.write(b"TQX2")
            synthetic(out)
        return
    src, dst = sys.argv[1], sys.argv[2]
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else 65536
    with open(dst, "wb") as out:
        out.write(b"TQX2")
        model_tensors(out, src, limit)


if __name__ == "__main__":
    main()
