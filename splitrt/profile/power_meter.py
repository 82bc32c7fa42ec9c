"""An external power meter fed from a CSV or serial stream: ``csv:PATH``.

The meter's logger (or the meter itself, on a serial port configured with ``stty``) writes one line per
sample, ``<unix time s>,<watts>`` (a header line, ``#`` comments and blank lines are skipped; ``;``,
tab or space separators work too). The reader integrates the samples with trapezoids between their own
timestamps, so its figure covers the meter's clock up to the newest line received: a logger that
buffers lags the host by its flush interval. The file is opened non-blocking: a regular file being
appended to, a FIFO and a tty all work.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from splitrt.errors import PowerError

_SEP = re.compile(r"[,;\t ]+")


class CsvMeterReader:
    name = "csv"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise PowerError(f"{self.path}: expected a meter's CSV file or serial device, got no such file") from None
        except OSError as exc:
            raise PowerError(f"{self.path}: expected a readable meter stream, got {exc}") from exc
        self._buf = b""
        self._line_no = 0
        self._last: tuple[float, float] | None = None  # (t_s, power_w) of the newest sample
        self._total_uj = 0.0
        self.samples = 0

    def _read_available(self) -> bytes:
        chunks = []
        while True:
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError as exc:
                raise PowerError(f"{self.path}: expected a readable meter stream, got {exc}") from exc
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def feed_line(self, line: str) -> None:
        """Add one sample line (public for tests and for meters read by other means)."""
        self._line_no += 1
        text = line.strip()
        if not text or text.startswith("#"):
            return
        fields = _SEP.split(text)
        try:
            t_s, power_w = float(fields[0]), float(fields[1])
        except (ValueError, IndexError):
            if self.samples == 0 and self._line_no == 1:
                return  # a header line
            raise PowerError(
                f"{self.path}:{self._line_no}: expected '<unix time s>,<watts>', got {text[:60]!r}"
            ) from None
        if not (math.isfinite(t_s) and math.isfinite(power_w) and power_w >= 0):
            raise PowerError(f"{self.path}:{self._line_no}: expected finite time and watts >= 0, got {text[:60]!r}")
        if self._last is not None:
            t0_s, p0_w = self._last
            if t_s < t0_s:
                raise PowerError(f"{self.path}:{self._line_no}: expected time >= the previous line's {t0_s}, got {t_s}")
            self._total_uj += (t_s - t0_s) * (p0_w + power_w) / 2 * 1e6
        self._last = (t_s, power_w)
        self.samples += 1

    def energy_uj(self) -> float:
        self._buf += self._read_available()
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            self.feed_line(raw.decode("utf-8", errors="replace"))
        return self._total_uj

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
