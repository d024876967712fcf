// safetensors round trips, sliced reads against slices of the full tensor,
// sharded checkpoints, and every hand-made bad file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "io/bad_checkpoints.h"
#include "tp/models/checkpoint.h"
#include "tp/io/safetensors.h"
#include "tp/io/writer.h"
#include "tp/models/presets.h"

namespace tp::io {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tp_test_io_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

Tensor ints(const Shape& shape, DType dtype) {
  std::vector<int64_t> v(static_cast<size_t>(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i * 2654435761u % 1000003) - 500000;
  return Tensor::from_ints(v, shape, dtype);
}

// A slice of `full` by plain tensor ops: the oracle for read_slice.
Tensor oracle_slice(const Tensor& full, int64_t dim, const std::vector<ChunkSpan>& spans) {
  std::vector<Tensor> parts;
  for (const ChunkSpan& s : spans) parts.push_back(full.narrow(dim, s.offset, s.size));
  return cat(parts, dim);
}

TEST(Safetensors, RoundTripIsBitIdenticalForEveryDtype) {
  fs::path dir = temp_dir("roundtrip");
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"f32", Tensor::randn({3, 5, 7}, 1)},
      {"bf16", Tensor::randn({33, 17}, 2, 0.f, 1.f, DType::BF16)},
      {"f16", Tensor::randn({129}, 3, 0.f, 1.f, DType::F16)},
      {"i32", ints({6, 4}, DType::I32)},
      {"i64", ints({5}, DType::I64)},
      {"scalar", Tensor::full({}, 3.5)},
      {"empty", Tensor::empty({0, 4})},
  };
  save_safetensors(dir / "a.safetensors", tensors, {{"format", "pt"}, {"note", "x"}});
  auto f = SafetensorsFile::open(dir / "a.safetensors");
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "x");
  ASSERT_EQ(f->tensors().size(), tensors.size());
  for (auto& [name, t] : tensors) {
    Tensor r = f->read(name);
    EXPECT_TRUE(equal(r, t)) << name;
    EXPECT_EQ(f->find(name)->dtype, t.dtype());
  }
  // The data area starts 8-byte aligned (header padded with spaces), and the
  // reference loader's stricter rule holds: spans are contiguous from 0 and
  // cover the data area exactly, with no holes.
  std::ifstream in(dir / "a.safetensors", std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  size_t end = 0;
  for (const TensorInfo& t : f->tensors()) {
    EXPECT_EQ(t.data_begin, end) << t.name;
    end = t.data_begin + t.nbytes;
  }
  EXPECT_EQ(8 + n + end, f->file_size());
  // Conversions on read.
  Tensor as_f32 = f->read("bf16", DType::F32);
  EXPECT_EQ(as_f32.dtype(), DType::F32);
  EXPECT_TRUE(equal(as_f32, tensors[1].second.to(DType::F32)));
  EXPECT_TRUE(equal(f->read("i32", DType::I64), tensors[3].second.to(DType::I64)));
  EXPECT_THROW(f->read("nope"), Error);
}

TEST(Safetensors, ReadWithoutConversionIsAViewOfTheMapping) {
  fs::path dir = temp_dir("view");
  Tensor t = Tensor::randn({64, 64}, 4);
  save_safetensors(dir / "v.safetensors", {{"t", t}});
  Tensor view;
  {
    auto f = SafetensorsFile::open(dir / "v.safetensors");
    view = f->read("t");
    EXPECT_EQ(static_cast<const void*>(view.raw_data()), static_cast<const void*>(f->data(*f->find("t"))));
    Tensor second = f->read("t");
    EXPECT_TRUE(view.same_storage(second));
  }
  // The view keeps the mapping alive after the file object is gone...
  EXPECT_TRUE(equal(view, t));
  // ...and writing into it does not change the file.
  view.data<float>()[0] = 1234.f;
  EXPECT_TRUE(equal(SafetensorsFile::open(dir / "v.safetensors")->read("t"), t));
}

TEST(Safetensors, SlicesEqualSlicesOfTheFullTensor) {
  fs::path dir = temp_dir("slices");
  Tensor w = Tensor::randn({12, 10}, 5);
  Tensor w3 = Tensor::randn({3, 8, 5}, 6, 0.f, 1.f, DType::BF16);
  Tensor odd = Tensor::randn({7, 5}, 7);
  save_safetensors(dir / "s.safetensors", {{"w", w}, {"w3", w3}, {"odd", odd}});
  auto f = SafetensorsFile::open(dir / "s.safetensors");
  for (int64_t world : {1, 2, 3, 4}) {
    for (int64_t rank = 0; rank < world; ++rank) {
      // Shard(0) rows and Shard(1) columns, torch.chunk rule (uneven included).
      for (int64_t dim : {0, 1, -1}) {
        const std::string& name = "odd";
        ChunkSpan s = chunk_span(odd.size(dim), world, rank);
        EXPECT_TRUE(equal(f->read_slice(name, dim, {s}), oracle_slice(odd, dim, {s})))
            << "dim " << dim << " rank " << rank << "/" << world;
      }
      // StridedShard(0, split_factor=2): both halves (e.g. gate and up packed) split
      // across ranks, this rank's piece of each concatenated.
      std::vector<ChunkSpan> groups;
      for (int64_t g = 0; g < 2; ++g) {
        ChunkSpan s = chunk_span(6, world, rank);
        groups.push_back({g * 6 + s.offset, s.size});
      }
      EXPECT_TRUE(equal(f->read_slice("w", 0, groups), oracle_slice(w, 0, groups)));
      // Middle dim of a 3-D bf16 tensor, converted to f32 on the way.
      ChunkSpan m = chunk_span(8, world, rank);
      Tensor got = f->read_slice("w3", 1, {m}, DType::F32);
      EXPECT_TRUE(equal(got, oracle_slice(w3, 1, {m}).to(DType::F32)));
    }
  }
  // Empty piece (a trailing rank with nothing), and errors name the tensor.
  EXPECT_EQ(f->read_slice("w", 0, {{12, 0}}).numel(), 0);
  try {
    f->read_slice("w", 1, {{8, 4}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'w' [12, 10]: slice [8, 12) outside dim 1 of size 10"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(f->read_slice("w", 2, {{0, 1}}), Error);
}

TEST(Safetensors, LargeReadsAreCutIntoPiecesCorrectly) {
  // 6 MiB bf16 (> the 4 MiB read pieces, and > the 1 MiB conversion buffer).
  fs::path dir = temp_dir("large");
  Tensor t = Tensor::randn({1536, 2048}, 8, 0.f, 1.f, DType::BF16);
  save_safetensors(dir / "l.safetensors", {{"small", Tensor::randn({3}, 1)}, {"t", t}});
  auto f = SafetensorsFile::open(dir / "l.safetensors");
  EXPECT_TRUE(equal(f->read_slice("t", 0, {}), t));
  EXPECT_TRUE(equal(f->read("t", DType::F32), t.to(DType::F32)));
  std::vector<ChunkSpan> groups = {{100, 700}, {800, 700}};
  EXPECT_TRUE(equal(f->read_slice("t", 0, groups, DType::F32), oracle_slice(t, 0, groups).to(DType::F32)));
  ChunkSpan c = chunk_span(2048, 3, 1);
  EXPECT_TRUE(equal(f->read_slice("t", 1, {c}, DType::F32), oracle_slice(t, 1, {c}).to(DType::F32)));
}

TEST(Safetensors, FileTruncatedAfterOpenIsAnErrorNotACrash) {
  fs::path dir = temp_dir("shrunk");
  Tensor t = Tensor::randn({512, 1024}, 9);  // 2 MiB
  save_safetensors(dir / "s.safetensors", {{"t", t}});
  auto f = SafetensorsFile::open(dir / "s.safetensors");
  fs::resize_file(dir / "s.safetensors", 4096);
  try {
    f->read_slice("t", 1, {{0, 512}});  // many runs, read on several threads
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unexpected end of file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("s.safetensors"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, ShardedWriteAndReadWithIndex) {
  fs::path dir = temp_dir("sharded");
  ModelConfig c = make_preset_config("llama", "tiny");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const ParamSpec& p : checkpoint_layout(c)) tensors.emplace_back(p.name, init_param(p, 0.02, 9, DType::BF16));
  // ~0.47 MB per layer: a 200 KB limit forces several shards.
  save_checkpoint(dir, c, tensors, 200000);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  size_t total = 0;
  for (auto& [n, t] : tensors) total += t.nbytes();
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["weight_map"].size(), tensors.size());

  Checkpoint ck = Checkpoint::open(dir);
  EXPECT_TRUE(ck.sharded());
  EXPECT_GT(ck.files().size(), 2u);
  const std::string last = fmt::format("model-{:05d}-of-{:05d}.safetensors", ck.files().size(), ck.files().size());
  EXPECT_TRUE(fs::exists(dir / last));
  EXPECT_EQ(ck.tensor_names().size(), tensors.size());
  EXPECT_EQ(ck.config().num_hidden_layers, 2);
  for (auto& [name, t] : tensors) {
    ASSERT_TRUE(ck.has(name));
    EXPECT_TRUE(equal(ck.read(name), t)) << name;
    EXPECT_LE(ck.info(name).nbytes, 200000u);
  }
  ChunkSpan s = chunk_span(516, 3, 2);
  EXPECT_TRUE(equal(ck.read_slice("lm_head.weight", 0, {s}, DType::F32),
                    tensors.back().second.narrow(0, s.offset, s.size).to(DType::F32)));
  EXPECT_THROW(ck.info("model.layers.9.mlp.up_proj.weight"), Error);
  // Saving again as a single file replaces the shards.
  save_checkpoint(dir, c, tensors);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / last));
  EXPECT_FALSE(Checkpoint::open(dir).sharded());
}

TEST(Checkpoint, EveryBadFileIsAnErrorNamingFileAndTensor) {
  auto cases = testing::make_bad_checkpoints(temp_dir("bad"));
  ASSERT_GE(cases.size(), 20u);
  for (const testing::BadCase& bc : cases) {
    if (bc.needs_verify) continue;  // valid headers: tested through `tp inspect --verify`
    try {
      Checkpoint::open(bc.dir);
      ADD_FAILURE() << bc.name << ": opened without error";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(bc.bad_file.string()), std::string::npos) << bc.name << ": " << msg;
      EXPECT_NE(msg.find(bc.expected), std::string::npos) << bc.name << ": " << msg;
      if (!bc.tensor.empty()) {
        EXPECT_NE(msg.find("'" + bc.tensor + "'"), std::string::npos) << bc.name << ": " << msg;
      }
    }
  }
}

TEST(Checkpoint, MissingDirectoryOrWeights) {
  EXPECT_THROW(Checkpoint::open("/nonexistent/model"), Error);
  fs::path dir = temp_dir("noweights");
  testing::write_valid_checkpoint(dir);
  fs::remove(dir / "model.safetensors");
  try {
    Checkpoint::open(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no model.safetensors or model.safetensors.index.json"), std::string::npos);
  }
}

TEST(Writer, ParseSizeUsesTransformersUnits) {
  EXPECT_EQ(parse_size("5GB"), 5000000000u);
  EXPECT_EQ(parse_size("2GiB"), 2ull << 30);
  EXPECT_EQ(parse_size("500MB"), 500000000u);
  EXPECT_EQ(parse_size("64KiB"), 65536u);
  EXPECT_EQ(parse_size("1000"), 1000u);
  EXPECT_THROW(parse_size("lots"), Error);
  EXPECT_THROW(parse_size("0"), Error);
}

}  // namespace
}  // namespace tp::io
