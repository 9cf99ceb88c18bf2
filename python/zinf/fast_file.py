# SPDX-License-Identifier: Apache-2.0
"""File objects that move torch.save / torch.load bytes through O_DIRECT (zinf.torch's
FastFileWriter and FastFileReader, which zinf.torch re-exports): zinf's I/O engine writes
and reads aligned staging buffers while Python fills or drains the other one."""

from __future__ import annotations

import io
import os
from typing import Optional, Union

from zinf import _native
from zinf.pinned import fs_path


# 8 MiB: each buffer is one submission, which the I/O engine cuts into 1 MiB pieces kept in
# flight together; two of them are what a writer holds.
_FAST_FILE_BUFFER = 8 << 20


class FastFileWriter(io.RawIOBase):
    """A file object for torch.save that writes `path` through O_DIRECT: write() copies into
    one of two aligned staging buffers while the other is being written by zinf's I/O engine,
    and close() writes the last partial block padded to the alignment, truncates the file to
    the bytes written and fsyncs it (sync=True), so the file is durable once close() returns.

        with zinf.torch.FastFileWriter(path) as f:
            torch.save(model.state_dict(), f)

    torch.save (1.13 and later) only calls write() and flush() on a file object; this writer
    writes front to back: tell() works, and seek() to anywhere but the current position raises
    io.UnsupportedOperation. flush() waits for the full buffers written so far; the tail is
    written by close() (also at garbage collection, where an error can only be printed: close
    it, or use `with`). Where the file system refuses O_DIRECT the file is written buffered
    (the same bytes; is_direct says which). Errors are zinf.IoError, an OSError with errno and
    filename (and offset, length): a path that cannot be created at construction; ENOSPC or
    any failed write at the next flush() or close(), and at every one after it.

    write() never raises a failed write: it takes the bytes (and, once a write has failed,
    drops them) and leaves the error to flush() and close(). torch.save calls flush() after
    its last write, so the error reaches the caller of torch.save; an error raised inside
    write() would leave torch's zip writer half-written, and torch 1.13's then aborts the
    process when it is destroyed (it finishes the file in its destructor, which throws).
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], buffer_bytes: int = _FAST_FILE_BUFFER,
                 sync: bool = True) -> None:
        super().__init__()
        self.name = fs_path(path, "path")
        self._native = _native.DirectFileWriter(self.name, int(buffer_bytes), bool(sync))
        self._failure: Optional[OSError] = None  # the first failed write, raised by flush()
        self._dropped = 0  # bytes taken after that failure

    def writable(self):
        return True

    def seekable(self):
        return False

    @property
    def is_direct(self):
        """True if the file is open with O_DIRECT."""
        return self._native.is_direct()

    def write(self, b):
        if self.closed:
            raise ValueError("zinf: FastFileWriter.write on a closed file " + self.name)
        # As bytes, one contiguous run (cast refuses a strided view with TypeError).
        view = memoryview(b).cast("B")
        if self._failure is None:
            before = self._native.size()
            try:
                return self._native.write(view)
            except OSError as e:
                self._failure = e
                # tell() counts every byte taken: the failed call's are all taken.
                self._dropped = before + len(view) - self._native.size()
                return len(view)
        self._dropped += len(view)
        return len(view)

    def tell(self):
        return self._native.size() + self._dropped

    def seek(self, offset, whence=io.SEEK_SET):
        here = self._native.size()
        target = {io.SEEK_SET: offset, io.SEEK_CUR: here + offset, io.SEEK_END: here + offset}
        if target.get(whence) == here:
            return here
        raise io.UnsupportedOperation(
            "zinf: FastFileWriter writes %s front to back; seek(%d, %d) from %d refused"
            % (self.name, offset, whence, here))

    def flush(self):
        if self.closed:
            return
        if self._failure is not None:
            raise self._failure
        self._native.flush()

    def close(self):
        if self.closed:
            return
        try:
            self._native.close()
        finally:
            super().close()


class FastFileReader(io.RawIOBase):
    """A file object for torch.load that reads `path` through O_DIRECT into an aligned window
    of buffer_bytes (small reads are served from the window; a large one goes window by
    window). Seekable, as torch.load's zip reader needs. Errors: zinf.IoError (OSError with
    errno, filename, offset, length).

        with zinf.torch.FastFileReader(path) as f:
            state = torch.load(f)
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"],
                 buffer_bytes: int = _FAST_FILE_BUFFER) -> None:
        super().__init__()
        self.name = fs_path(path, "path")
        self._native = _native.DirectFileReader(self.name, int(buffer_bytes))
        self._pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    @property
    def is_direct(self):
        """True if the file is open with O_DIRECT."""
        return self._native.is_direct()

    def readinto(self, b):
        if self.closed:
            raise ValueError("zinf: FastFileReader.readinto on a closed file " + self.name)
        n = self._native.read_into(self._pos, b)
        self._pos += n
        return n

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._native.size()}
        if whence not in base:
            raise ValueError("zinf: FastFileReader.seek: bad whence %r" % (whence,))
        pos = base[whence] + offset
        if pos < 0:
            raise OSError(22, "zinf: FastFileReader.seek to a negative position", self.name)
        self._pos = pos
        return pos
