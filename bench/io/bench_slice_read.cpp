// Shard-on-read, measured: write a [rows, 16384] f32 tensor (default 1 GiB),
// then, each time from a cold page cache, read a 1/4 column slice (Shard(1) at
// tp 4), a 1/4 row slice (Shard(0)) and the whole tensor. Reports the median
// time, the fraction of the tensor's pages brought in (mincore) and page faults.
//   bench_io_slice_read [--mib 1024] [--reps 5] [--dir /tmp]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include "tp/io/safetensors.h"
#include "tp/io/writer.h"

namespace fs = std::filesystem;
using namespace tp;

namespace {

double resident_fraction(const uint8_t* p, size_t n) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~(page - 1), e = reinterpret_cast<uintptr_t>(p) + n;
  std::vector<unsigned char> vec((e - b + page - 1) / page);
  mincore(reinterpret_cast<void*>(b), e - b, vec.data());
  size_t r = 0;
  for (unsigned char v : vec) r += v & 1;
  return static_cast<double>(r) / vec.size();
}

void drop_cache(const fs::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY);
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

struct Sample {
  double ms, resident;
  long minor, major;
};

Sample measure(const fs::path& file, const std::function<Tensor(const io::SafetensorsFile&)>& read) {
  drop_cache(file);
  auto f = io::SafetensorsFile::open(file);
  const io::TensorInfo& info = *f->find("w");
  if (resident_fraction(f->data(info), info.nbytes) > 0.02) std::printf("  (warning: page cache not dropped)\n");
  rusage r0{}, r1{};
  getrusage(RUSAGE_SELF, &r0);
  auto t0 = std::chrono::steady_clock::now();
  Tensor t = read(*f);
  auto t1 = std::chrono::steady_clock::now();
  getrusage(RUSAGE_SELF, &r1);
  return {std::chrono::duration<double, std::milli>(t1 - t0).count(), resident_fraction(f->data(info), info.nbytes),
          r1.ru_minflt - r0.ru_minflt, r1.ru_majflt - r0.ru_majflt};
}

Sample median(std::vector<Sample> v) {
  auto mid = [&](auto key) {
    std::sort(v.begin(), v.end(), [&](const Sample& a, const Sample& b) { return key(a) < key(b); });
    return v[v.size() / 2];
  };
  Sample m = mid([](const Sample& s) { return s.ms; });
  m.resident = mid([](const Sample& s) { return s.resident; }).resident;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 1024, reps = 5;
  fs::path dir = fs::temp_directory_path();
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--mib") mib = std::stoll(argv[i + 1]);
    else if (a == "--reps") reps = std::stoll(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
  }
  const int64_t cols = 16384, rows = mib * 16;  // 64 KiB per row
  fs::path file = dir / "tp_bench_slice_read.safetensors";
  {
    Tensor t = Tensor::empty({rows, cols});
    float* p = t.data<float>();
#pragma omp parallel for
    for (int64_t i = 0; i < rows * cols; ++i) p[i] = static_cast<float>(i % 8191);
    io::save_safetensors(file, {{"w", t}});
  }
  std::printf("tensor [%lld, %lld] f32, %lld MiB, %lld cold-cache reps, medians:\n", static_cast<long long>(rows),
              static_cast<long long>(cols), static_cast<long long>(mib), static_cast<long long>(reps));
  struct Case {
    const char* name;
    std::function<Tensor(const io::SafetensorsFile&)> read;
  };
  const ChunkSpan c = chunk_span(cols, 4, 1), r = chunk_span(rows, 4, 1);
  std::vector<Case> cases = {
      {"full tensor (copy)", [&](const io::SafetensorsFile& f) { return f.read_slice("w", 0, {{0, rows}}); }},
      {"full tensor (view, touched)",
       [&](const io::SafetensorsFile& f) {
         Tensor v = f.read("w");
         const uint8_t* p = static_cast<const uint8_t*>(v.raw_data());
         volatile uint8_t sink = 0;
         for (size_t i = 0; i < v.nbytes(); i += 4096) sink = sink + p[i];
         return v;
       }},
      {"1/4 columns (Shard(1), tp 4)", [&](const io::SafetensorsFile& f) { return f.read_slice("w", 1, {c}); }},
      {"1/4 rows (Shard(0), tp 4)", [&](const io::SafetensorsFile& f) { return f.read_slice("w", 0, {r}); }},
  };
  double full_ms = 0;
  for (const Case& k : cases) {
    std::vector<Sample> samples;
    for (int64_t i = 0; i < reps; ++i) samples.push_back(measure(file, k.read));
    Sample m = median(samples);
    if (full_ms == 0) full_ms = m.ms;
    std::printf("  %-30s %9.1f ms (%.2fx full)  pages resident %5.1f%%  faults minor %ld major %ld\n", k.name, m.ms,
                m.ms / full_ms, 100 * m.resident, m.minor, m.major);
  }
  fs::remove(file);
  return 0;
}
