#!/usr/bin/env python3
"""Plots troupe-bench's sweep: output tokens/s per GPU (y) against tokens/s per user (x), one line
per system (Troupe, and the transformers baseline when its bench_hf.py --json is given), each
point labelled with its concurrency (batch for transformers). Writes a PNG.

    python3 tools/bench_plot.py serve-bench.json [--hf hf.json] [--out serve-bench.png] [--title T]

Only the standard library: the GPU node and the dev machines have no matplotlib. A PNG is an RGB
raster compressed with zlib in chunks framed by struct; a small rasterizer draws the axes, grid,
lines and dots; text uses the 5x7 bitmap font below (printable ASCII; anything else shows as '?').
Troupe's per-GPU figure divides by the "gpus" troupe-bench recorded (--gpus); transformers runs on
one GPU (--hf-gpus otherwise). Axes start at 0.
"""
import argparse
import json
import math
import struct
import sys
import zlib

# 5x7 font, cell 6x10 with the descender rows. One string per glyph: a base-32 digit per row, top
# row first, bit 4 = the leftmost column; trailing empty rows left out.
_FONT_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz.,-/=():%+_[]!'?#<>*|;"
_FONT_ROWS = """
ehjlphe 4c4444e eh1248v v2421he 26aiv22 vgu11he 68guhhe v124888 ehhehhe ehhf12c ehhvhhh uhhuhhu
ehggghe sihhhis vgguggv vgguggg ehgnhhf hhhvhhh e44444e 72222ic hikokih ggggggv hrllhhh hhpljhh
ehhhhhe uhhuggg ehhhlid uhhukih fgge11u v444444 hhhhhhe hhhhha4 hhhllla hha4ahh hha4444 v1248gv
00e1fhf ggmphhu 00egghe 11djhhf 00ehvge 698s888 00fhhhf1e ggmphhh 40c444e 2062222ic ggikoki
c44444e 00qllll 00mphhh 00ehhhe 00uhhhugg 00fhhhf11 00mpggg 00ege1u 88s8896 00hhhjd 00hhha4
00hhlla 00ha4ah 00hhhhf1e 00v248v 00000cc 00000cc48 000v 01248g 00v0v 2488842 8422248 0cc0cc
op248j3 044v44 000000v e88888e e22222e 4444404 448 eh12404 aavavaa 248g842 8421248 04lel4 4444444
0cc0cc48
""".split()
FONT = dict(zip(_FONT_CHARS, ([int(d, 32) for d in g] for g in _FONT_ROWS)))
FONT[" "] = []

BLACK, GREY, LIGHT, WHITE = (0, 0, 0), (110, 110, 110), (228, 228, 228), (255, 255, 255)
COLORS = [(31, 119, 180), (230, 110, 20), (44, 160, 44), (200, 40, 40)]


class Canvas:
    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray(WHITE * (w * h))

    def dot(self, x, y, c):
        if 0 <= x < self.w and 0 <= y < self.h:
            i = 3 * (y * self.w + x)
            self.px[i:i + 3] = bytes(c)

    def rect(self, x0, y0, x1, y1, c):
        for y in range(max(y0, 0), min(y1, self.h)):
            for x in range(max(x0, 0), min(x1, self.w)):
                self.dot(x, y, c)

    def line(self, x0, y0, x1, y1, c, width=1):
        """Straight segment, `width` pixels thick (a square brush stepped along it)."""
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        lo = -(width // 2)
        for k in range(n + 1):
            x, y = round(x0 + (x1 - x0) * k / n), round(y0 + (y1 - y0) * k / n)
            self.rect(x + lo, y + lo, x + lo + width, y + lo + width, c)

    def disc(self, cx, cy, r, c):
        for y in range(-r, r + 1):
            for x in range(-r, r + 1):
                if x * x + y * y <= r * r + r:
                    self.dot(cx + x, cy + y, c)

    def text(self, x, y, s, c, scale=2, align="left", vertical=False):
        """Draws s with its top-left at (x, y) (align: left / center / right of x). vertical: turned
        90 degrees counter-clockwise, reading upwards, (x, y) then the bottom-left."""
        width = text_width(s, scale)
        off = {"left": 0, "center": width // 2, "right": width}[align]
        for i, ch in enumerate(s):
            rows = FONT.get(ch, FONT["?"])
            for r, bits in enumerate(rows):
                for col in range(5):
                    if bits >> (4 - col) & 1:
                        u, v = i * 6 * scale + col * scale - off, r * scale   # along, down the glyph
                        for dy in range(scale):
                            for dx in range(scale):
                                if vertical:
                                    self.dot(x + v + dy, y - u - dx, c)
                                else:
                                    self.dot(x + u + dx, y + v + dy, c)

    def png(self):
        raw = b"".join(b"\0" + bytes(self.px[3 * y * self.w:3 * (y + 1) * self.w]) for y in range(self.h))

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def text_width(s, scale):
    return len(s) * 6 * scale - scale


def nice_ticks(hi, want=6):
    """Ticks 0, step, ... covering hi, step 1, 2 or 5 x 10^k."""
    hi = hi if hi > 0 else 1
    raw = hi / want
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    n = math.ceil(hi / step - 1e-9)
    digits = max(0, -math.floor(math.log10(step) + 1e-9))
    return [k * step for k in range(n + 1)], digits


def plot(series, title, xlabel, ylabel, out, w=1000, h=700):
    """series: [(name, color, [(x, y, label)])]."""
    cv = Canvas(w, h)
    left, right, top, bottom = 120, w - 40, 70, h - 90
    pts = [p for _, _, s in series for p in s]
    xt, xd = nice_ticks(max(p[0] for p in pts) * 1.08)
    yt, yd = nice_ticks(max(p[1] for p in pts) * 1.08)

    def X(v):
        return round(left + (right - left) * v / xt[-1])

    def Y(v):
        return round(bottom - (bottom - top) * v / yt[-1])

    for v in xt:
        cv.line(X(v), top, X(v), bottom, LIGHT)
        cv.line(X(v), bottom, X(v), bottom + 6, BLACK)
        cv.text(X(v), bottom + 12, f"{v:.{xd}f}", BLACK, align="center")
    for v in yt:
        cv.line(left, Y(v), right, Y(v), LIGHT)
        cv.line(left - 6, Y(v), left, Y(v), BLACK)
        cv.text(left - 12, Y(v) - 7, f"{v:.{yd}f}", BLACK, align="right")
    cv.line(left, top, left, bottom, BLACK, 2)
    cv.line(left, bottom, right, bottom, BLACK, 2)
    cv.text((left + right) // 2, 22, title, BLACK, align="center")
    cv.text((left + right) // 2, bottom + 48, xlabel, BLACK, align="center")
    cv.text(24, (top + bottom) // 2 + text_width(ylabel, 2) // 2, ylabel, BLACK, vertical=True)
    for name, color, s in series:
        s = sorted(s, key=lambda p: p[2])
        for a, b in zip(s, s[1:]):
            cv.line(X(a[0]), Y(a[1]), X(b[0]), Y(b[1]), color, 3)
        for x, y, label in s:
            cv.disc(X(x), Y(y), 6, color)
            cv.text(X(x) + 9, Y(y) - 22, str(label), color)
    # Legend, top right inside the plot.
    lw = max(text_width(name, 2) for name, _, _ in series) + 50
    lx, ly = right - lw - 10, top + 10
    lh = 12 + 26 * len(series)
    cv.rect(lx, ly, lx + lw, ly + lh, WHITE)
    for x0, y0, x1, y1 in ((lx, ly, lx + lw, ly), (lx, ly + lh, lx + lw, ly + lh), (lx, ly, lx, ly + lh),
                           (lx + lw, ly, lx + lw, ly + lh)):
        cv.line(x0, y0, x1, y1, GREY)
    for i, (name, color, _) in enumerate(series):
        yy = ly + 12 + 26 * i
        cv.line(lx + 8, yy + 7, lx + 34, yy + 7, color, 3)
        cv.disc(lx + 21, yy + 7, 5, color)
        cv.text(lx + 42, yy, name, BLACK)
    with open(out, "wb") as f:
        f.write(cv.png())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("troupe", help="troupe-bench --json output (the concurrency sweep)")
    ap.add_argument("--hf", help="bench_hf.py --json output (the transformers baseline)")
    ap.add_argument("--hf-gpus", type=int, default=1)
    ap.add_argument("--out", default="bench.png")
    ap.add_argument("--title")
    a = ap.parse_args()
    t = json.load(open(a.troupe))
    if t.get("mode") == "multi-turn":
        sys.exit("bench_plot: %s is a multi-turn result; plot the concurrency sweep's JSON" % a.troupe)
    gpus = t.get("gpus", 1)
    series = [(f"Troupe ({gpus} GPU)" if gpus == 1 else f"Troupe ({gpus} GPUs)", COLORS[0],
               [(l["tokens_per_s_per_user"], l["output_tokens_per_s"] / gpus, l["concurrency"])
                for l in t["levels"] if l["requests"] > 0])]
    if a.hf:
        h = json.load(open(a.hf))
        series.append((f"transformers ({h.get('attn', 'eager')})", COLORS[1],
                       [(l["tokens_per_s_per_user"], l["output_tokens_per_s"] / a.hf_gpus, l["batch"])
                        for l in h["levels"]]))
    if not any(s for _, _, s in series):
        sys.exit("bench_plot: no level with a completed request")
    title = a.title or f"input {t.get('input_len', '?')} / output {t.get('output_len', '?')} tokens; points: concurrency"
    plot(series, title, "tokens/s per user", "output tokens/s per GPU", a.out)
    print(f"bench_plot: wrote {a.out}")


if __name__ == "__main__":
    main()
