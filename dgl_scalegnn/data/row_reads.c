/* Rows of a file read with one pread a run, for dgl_scalegnn/data/row_reads.py (which
 * declares the prototype, checked against the definition here, and calls it through
 * ctypes).
 */
#include <errno.h>
#include <stdint.h>
#include <unistd.h>

/* Runs of rows of a file into `out`, packed: run i is `counts[i]` rows (one where `counts`
 * is NULL) of `row_bytes` from row `starts[i]` of the array at byte `base`, read with
 * one pread a run. Reading through a memory map instead would map each row's page, and
 * on a page cache of large folios the whole folio, into the resident set. Returns the
 * bytes read, or -1 (errno set) on an error or a short file. */
int64_t pread_runs(int fd, int64_t base, int64_t row_bytes, const int64_t *restrict starts,
                   const int64_t *restrict counts, int64_t n, char *restrict out) {
  char *dst = out;
  for (int64_t i = 0; i < n; ++i) {
    int64_t left = (counts ? counts[i] : 1) * row_bytes;
    int64_t offset = base + starts[i] * row_bytes;
    while (left > 0) {
      ssize_t got = pread(fd, dst, (size_t)left, (off_t)offset);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        if (got == 0) errno = EIO;
        return -1;
      }
      dst += got;
      offset += got;
      left -= got;
    }
  }
  return (int64_t)(dst - out);
}
