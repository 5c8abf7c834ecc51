#!/usr/bin/env python3
"""Dump raw quantized blocks of a GGUF file together with the PyPI `gguf`
package's numpy dequantization of them, for tests/quant_xcheck_test.cpp:

    python scripts/quant_xcheck.py MODEL.gguf /tmp/xcheck.bin [max_elems_per_tensor]
    TANDEM_QUANT_XCHECK=/tmp/xcheck.bin ./build/tandem_tests --gtest_filter='QuantXcheck*'

Output: b"TQX1", then per tensor: u32 ggml type, u64 element count n,
u32 name length, name bytes, the raw bytes of the first n elements, n f32
values (all little-endian).
"""
import struct
import sys

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else 65536
    reader = GGUFReader(src)
    with open(dst, "wb") as out:
        out.write(b"TQX1")
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
            name = t.name.encode()
            out.write(struct.pack("<IQI", int(t.tensor_type), n, len(name)))
            out.write(name)
            out.write(chunk.tobytes())
            out.write(values.astype("<f4").tobytes())


if __name__ == "__main__":
    main()
