// Shard-on-read touches only the slice's pages: a 1/4 column slice of a
// 64 MiB tensor must bring about 1/4 of its pages into memory. Measured with
// mincore() after dropping the file from the page cache.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>

#include "tp/io/safetensors.h"
#include "tp/io/writer.h"

namespace tp::io {
namespace {

namespace fs = std::filesystem;

// Fraction of the pages of [p, p + n) resident in memory.
double resident_fraction(const uint8_t* p, size_t n) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~(page - 1), e = reinterpret_cast<uintptr_t>(p) + n;
  size_t pages = (e - b + page - 1) / page;
  std::vector<unsigned char> vec(pages);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(b), e - b, vec.data()), 0);
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return static_cast<double>(resident) / pages;
}

void drop_from_page_cache(const fs::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  fdatasync(fd);  // dirty pages cannot be dropped
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

TEST(PageTouch, QuarterColumnSliceTouchesAQuarterOfThePages) {
  const int64_t rows = 1024, cols = 16384;  // 64 KiB rows: a quarter is 4 of 16 pages
  fs::path dir = fs::temp_directory_path() / "tp_test_io_pages";
  fs::create_directories(dir);
  fs::path file = dir / "big.safetensors";
  {
    Tensor t = Tensor::empty({rows, cols});
    float* p = t.data<float>();
    for (int64_t i = 0; i < rows * cols; ++i) p[i] = static_cast<float>(i % 8191);
    save_safetensors(file, {{"w", t}});
  }
  drop_from_page_cache(file);
  auto f = SafetensorsFile::open(file);
  const TensorInfo& info = *f->find("w");
  double before = resident_fraction(f->data(info), info.nbytes);
  if (before > 0.05) GTEST_SKIP() << "cannot drop the file from the page cache here (" << before << " resident)";

  ChunkSpan s = chunk_span(cols, 4, 1);
  Tensor slice = f->read_slice("w", 1, {s});
  double after = resident_fraction(f->data(info), info.nbytes);
  // Each 16 KiB run spans 4 or 5 pages (the data area is 8-byte, not page, aligned).
  EXPECT_GT(after, 0.22);
  EXPECT_LT(after, 0.35) << "readahead or a full read pulled in pages outside the slice";
  for (int64_t r : {int64_t{0}, rows / 2, rows - 1})
    for (int64_t c : {int64_t{0}, s.size - 1})
      ASSERT_EQ(slice.at(r * s.size + c), static_cast<float>((r * cols + s.offset + c) % 8191));
  std::printf("resident after reading a 1/4 column slice: %.1f%% of the tensor's pages\n", 100 * after);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tp::io
