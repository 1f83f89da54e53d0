"""Minimal GGUF v3 reader and writer (numpy only).

The device machine has no `gguf` package, and the export needs a writer for the Q2_0 type that the
published `gguf` package may not know, so both directions live here (format: docs formats.md §4).
"""

import struct

import numpy as np

# GGUF metadata value types.
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
_SCALAR = {
    T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i",
    T_F32: "<f", T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d",
}

# ggml tensor types used here: (block size, bytes per block).
F32, F16, Q4_1, Q8_0, Q2_0 = 0, 1, 3, 8, 42
BLOCK = {F32: (1, 4), F16: (1, 2), Q4_1: (32, 20), Q8_0: (32, 34), Q2_0: (64, 18)}


class GGUFFile:
    """A parsed GGUF file: `kv` maps key -> (type, value, element type for arrays),
    `tensors` maps name -> (ggml type, ne list, absolute byte offset, byte size)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        self.pos = 0
        magic = self.buf[:4]
        if magic != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file (magic {magic!r})")
        self.pos = 4
        self.version = self._u("<I")
        if self.version != 3:
            raise ValueError(f"{path}: GGUF version {self.version}, expected 3")
        n_tensors = self._u("<q")
        n_kv = self._u("<q")
        self.kv = {}
        for _ in range(n_kv):
            key = self._str()
            vtype = self._u("<i")
            if vtype == T_ARR:
                etype = self._u("<i")
                n = self._u("<Q")
                self.kv[key] = (T_ARR, [self._val(etype) for _ in range(n)], etype)
            else:
                self.kv[key] = (vtype, self._val(vtype), None)
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            nd = self._u("<I")
            ne = [self._u("<q") for _ in range(nd)]
            ttype = self._u("<i")
            off = self._u("<Q")
            infos.append((name, ttype, ne, off))
        align = self.value("general.alignment", 32)
        data_start = (self.pos + align - 1) // align * align
        self.tensors = {}
        for name, ttype, ne, off in infos:
            bs, ts = BLOCK[ttype]
            n = int(np.prod(ne))
            size = n // bs * ts
            start = data_start + off
            if start + size > len(self.buf):
                raise ValueError(f"{path}: tensor {name} runs past the end of the file")
            self.tensors[name] = (ttype, ne, start, size)

    def _u(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def _str(self):
        n = self._u("<Q")
        s = self.buf[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def _val(self, vtype):
        if vtype == T_STR:
            return self._str()
        return self._u(_SCALAR[vtype])

    def value(self, key, default=None):
        return self.kv[key][1] if key in self.kv else default

    def raw(self, name):
        ttype, ne, start, size = self.tensors[name]
        return np.frombuffer(self.buf, dtype=np.uint8, count=size, offset=start)

    def tensor_f32(self, name):
        """Dequantize a tensor to float32 with numpy shape (ne[-1], ..., ne[0])."""
        ttype, ne, _, _ = self.tensors[name]
        raw = self.raw(name)
        shape = tuple(reversed(ne))
        if ttype == F32:
            return raw.view(np.float32).reshape(shape).copy()
        if ttype == F16:
            return raw.view(np.float16).astype(np.float32).reshape(shape)
        if ttype == Q8_0:
            blocks = raw.reshape(-1, 34)
            d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
            q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
            return (q * d).reshape(shape)
        if ttype == Q4_1:
            blocks = raw.reshape(-1, 20)
            d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
            m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
            qs = blocks[:, 4:]
            # Elements 0..15 are the low nibbles, 16..31 the high nibbles.
            nib = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float32)
            return (nib * d + m).reshape(shape)
        if ttype == Q2_0:
            d, t = q2_0_decode(raw, int(np.prod(ne)))
            return (d[:, None] * t.reshape(-1, 64)).reshape(shape)
        raise ValueError(f"tensor {name}: unsupported ggml type {ttype}")


def q2_0_decode(raw, n):
    """Q2_0 bytes -> (f32 scale per 64-block, int8 ternary values t = code - 1)."""
    blocks = raw.reshape(n // 64, 18)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32).reshape(-1)
    qs = blocks[:, 2:]
    codes = np.stack([(qs >> (2 * j)) & 3 for j in range(4)], axis=2).reshape(-1, 64)
    return d, codes.astype(np.int8) - 1


def q2_0_encode(codes_packed, scales_f16):
    """Pack rows already laid out as 2-bit LSB-first codes (4 per byte, 16 bytes per 64 weights)
    and one f16 scale per 64 weights into Q2_0 blocks: f16 d then 16 code bytes."""
    qs = np.ascontiguousarray(codes_packed).reshape(-1, 16)
    d = np.ascontiguousarray(scales_f16, dtype=np.float16).reshape(-1, 1).view(np.uint8)
    if qs.shape[0] != d.shape[0]:
        raise ValueError("Q2_0 encode: code and scale counts differ")
    return np.concatenate([d, qs], axis=1).reshape(-1)


class GGUFWriter:
    """Collects KV pairs and tensors, then writes a GGUF v3 file with the given alignment."""

    def __init__(self, alignment=32):
        self.alignment = alignment
        self.kv = []  # (key, type, value, element type)
        self.tensors = []  # (name, ggml type, ne, bytes)

    def add_kv(self, key, vtype, value, etype=None):
        self.kv.append((key, vtype, value, etype))

    def add_tensor(self, name, ttype, ne, data):
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        bs, ts = BLOCK[ttype]
        n = int(np.prod(ne))
        if ne[0] % bs or data.size != n // bs * ts:
            raise ValueError(f"tensor {name}: {data.size} bytes do not match type {ttype} ne {ne}")
        self.tensors.append((name, ttype, list(ne), data.tobytes()))

    @staticmethod
    def _s(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _val(self, vtype, v):
        return self._s(v) if vtype == T_STR else struct.pack(_SCALAR[vtype], v)

    def write(self, path):
        out = bytearray(b"GGUF")
        out += struct.pack("<Iqq", 3, len(self.tensors), len(self.kv))
        for key, vtype, value, etype in self.kv:
            out += self._s(key) + struct.pack("<i", vtype)
            if vtype == T_ARR:
                out += struct.pack("<iQ", etype, len(value))
                out += b"".join(self._val(etype, v) for v in value)
            else:
                out += self._val(vtype, value)
        offset = 0
        offsets = []
        for name, ttype, ne, data in self.tensors:
            offsets.append(offset)
            offset += (len(data) + self.alignment - 1) // self.alignment * self.alignment
        for (name, ttype, ne, data), off in zip(self.tensors, offsets):
            out += self._s(name) + struct.pack("<I", len(ne))
            out += b"".join(struct.pack("<q", x) for x in ne)
            out += struct.pack("<iQ", ttype, off)
        out += b"\0" * (-len(out) % self.alignment)
        for name, ttype, ne, data in self.tensors:
            out += data + b"\0" * (-len(data) % self.alignment)
        with open(path, "wb") as f:
            f.write(out)
