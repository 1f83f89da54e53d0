#!/usr/bin/env python3
"""Extract Jane Austen's six novels from the janeaustenr R lazy-load database.

Usage: janeausten.py <prefix> <outdir>
  <prefix>  path to the database without extension (…/janeaustenr/data/Rdata), so that
            <prefix>.rdx and <prefix>.rdb exist (Debian package r-cran-janeaustenr 1.0.0-1)
  <outdir>  receives <name>.txt for every novel, one Gutenberg line per line

Standard library only, so a fresh clone needs neither R nor any Python package.

Format (R's lazy-load database): <prefix>.rdx is a gzip-compressed R serialization of a list
with entries `variables` (object name -> integer (offset, length) into <prefix>.rdb),
`references` and `compressed`. Each .rdb chunk is a 4-byte big-endian uncompressed length followed
by a compressed R serialization of one object; here each object is a character vector (STRSXP).
The counts below are the expected output sizes (`wc -l -w -c`); a mismatch is an error, because
downstream perplexity fixtures depend on these exact bytes.
"""

import bz2
import gzip
import lzma
import os
import struct
import sys
import zlib

NOVELS = {  # name -> (lines, words, bytes)
    "emma": (16235, 157441, 883028),
    "mansfieldpark": (15349, 159540, 883280),
    "northangerabbey": (7856, 77141, 433411),
    "persuasion": (8328, 83283, 466854),
    "prideprejudice": (13030, 121567, 684768),
    "sensesensibility": (12624, 118565, 673688),
}

# SEXP type codes used by R's serializer (serialize.c / Rinternals.h).
NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP, DOTSXP = 9, 10, 13, 14, 15, 16, 17
VECSXP, EXPRSXP, RAWSXP = 19, 20, 24
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP = 255, 254, 253, 252
MISSINGARG_SXP, BASENAMESPACE_SXP, EMPTYENV_SXP, BASEENV_SXP = 251, 250, 242, 241
# Singletons that carry no payload; we only need them to keep the stream in sync.
SINGLETONS = {NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP,
              BASENAMESPACE_SXP, EMPTYENV_SXP, BASEENV_SXP}
LATIN1_MASK = 1 << 2  # CHARSXP "levels" bit: string is Latin-1, else UTF-8/ASCII


class RFormatError(Exception):
    pass


class RObject:
    """A decoded R value: `value` is a Python list/str/None, `attrs` a dict of attributes."""

    def __init__(self, sexptype, value, attrs=None):
        self.sexptype, self.value, self.attrs = sexptype, value, attrs or {}


class XdrReader:
    """Reads one R serialization stream in XDR (big-endian) format, versions 2 and 3."""

    def __init__(self, data):
        self.data, self.pos, self.refs = data, 0, []
        if data[:2] != b"X\n":
            raise RFormatError("not an XDR R serialization (header %r)" % data[:2])
        self.pos = 2
        version = self.int()
        self.int(), self.int()  # writer R version, minimal reader version
        if version == 3:
            self.take(self.int())  # native encoding name
        elif version != 2:
            raise RFormatError("unsupported serialization version %d" % version)

    def take(self, n):
        if n < 0 or self.pos + n > len(self.data):
            raise RFormatError("truncated stream at byte %d" % self.pos)
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int(self):
        return struct.unpack(">i", self.take(4))[0]

    def length(self):
        n = self.int()
        if n == -1:  # long vector: two more words
            hi, lo = self.int(), self.int()
            n = (hi << 32) | (lo & 0xFFFFFFFF)
        return n

    def item(self):
        flags = self.int()
        kind, levels = flags & 0xFF, flags >> 12
        has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if kind in SINGLETONS:
            return RObject(kind, None)
        if kind == REFSXP:
            index = flags >> 8
            if index == 0:
                index = self.int()
            return self.refs[index - 1]
        if kind == SYMSXP:
            obj = RObject(SYMSXP, self.item().value)
            self.refs.append(obj)
            return obj
        if kind in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP):
            return self.pairlist(kind, has_attr, has_tag)
        if kind == ENVSXP:
            obj = RObject(ENVSXP, None)
            self.refs.append(obj)
            self.int()  # locked flag
            for _ in range(4):  # enclosure, frame, hash table, attributes
                self.item()
            return obj
        if kind == CHARSXP:
            n = self.int()
            if n == -1:
                return RObject(CHARSXP, None)  # NA_character_
            raw = self.take(n)
            return RObject(CHARSXP, raw.decode("latin-1" if levels & LATIN1_MASK else "utf-8"))
        if kind in (VECSXP, EXPRSXP, STRSXP):
            value = [self.item().value if kind == STRSXP else self.item()
                     for _ in range(self.length())]
        elif kind in (INTSXP, LGLSXP):
            n = self.length()
            value = list(struct.unpack(">%di" % n, self.take(4 * n)))
        elif kind == REALSXP:
            n = self.length()
            value = list(struct.unpack(">%dd" % n, self.take(8 * n)))
        elif kind == CPLXSXP:
            n = self.length()
            value = list(struct.unpack(">%dd" % (2 * n), self.take(16 * n)))
        elif kind == RAWSXP:
            value = self.take(self.length())
        else:
            raise RFormatError("unsupported SEXP type %d at byte %d" % (kind, self.pos - 4))
        attrs = self.attributes() if has_attr else {}
        return RObject(kind, value, attrs)

    def pairlist(self, kind, has_attr, has_tag):
        # Pairlists are read iteratively along the CDR chain; each cell: [attr] [tag] car cdr.
        cells, attrs = [], {}
        while True:
            if has_attr:
                self.item()
            tag = self.item().value if has_tag else None
            cells.append((tag, self.item()))
            flags = self.int()
            nxt = flags & 0xFF
            if nxt != kind:
                self.pos -= 4
                tail = self.item()
                if tail.sexptype != NILVALUE_SXP:
                    cells.append((None, tail))
                break
            has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        return RObject(kind, cells, attrs)

    def attributes(self):
        obj = self.item()
        if obj.sexptype != LISTSXP:
            raise RFormatError("attributes are not a pairlist")
        return {tag: val for tag, val in obj.value}


def named_list(obj):
    names = obj.attrs.get("names")
    if names is None or len(names.value) != len(obj.value):
        raise RFormatError("expected a named list")
    return dict(zip(names.value, obj.value))


def decompress_chunk(chunk, compressed):
    size = struct.unpack(">I", chunk[:4])[0]
    body = chunk[4:]
    if compressed in (2, 3):  # a type byte follows the length
        kind, body = body[:1], body[1:]
        data = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress,
                b"0": lambda b: b}.get(kind, None)
        if data is None:
            raise RFormatError("unknown compression type %r" % kind)
        out = data(body)
    else:
        out = zlib.decompress(body)
    if len(out) != size:
        raise RFormatError("chunk decompressed to %d bytes, header says %d" % (len(out), size))
    return out


def extract(prefix):
    """Returns {name: text} for every character vector in the database."""
    with gzip.open(prefix + ".rdx", "rb") as f:
        index = named_list(XdrReader(f.read()).item())
    compressed = index["compressed"].value[0] if "compressed" in index else 1
    with open(prefix + ".rdb", "rb") as f:
        rdb = f.read()
    texts = {}
    for name, where in named_list(index["variables"]).items():
        offset, length = where.value
        obj = XdrReader(decompress_chunk(rdb[offset:offset + length], compressed)).item()
        if obj.sexptype != STRSXP:
            raise RFormatError("%s is SEXP type %d, not a character vector" % (name, obj.sexptype))
        texts[name] = "".join((line or "") + "\n" for line in obj.value)
    return texts


def counts(data):
    return data.count(b"\n"), len(data.split()), len(data)


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    prefix, outdir = argv[1], argv[2]
    try:
        texts = extract(prefix)
    except (OSError, RFormatError, zlib.error, EOFError, KeyError) as e:
        sys.stderr.write("janeausten: cannot read %s.rdx/.rdb: %s\n" % (prefix, e))
        return 1
    os.makedirs(outdir, exist_ok=True)
    bad = 0
    for name, expected in NOVELS.items():
        if name not in texts:
            sys.stderr.write("janeausten: %s missing from the database\n" % name)
            bad += 1
            continue
        data = texts[name].encode("utf-8")
        got = counts(data)
        status = "ok" if got == expected else "MISMATCH (expected %s)" % (expected,)
        print("%-18s lines %6d words %7d bytes %7d  %s" % ((name + ".txt",) + got + (status,)))
        if got != expected:
            bad += 1
            continue
        tmp = os.path.join(outdir, name + ".txt.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(outdir, name + ".txt"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
