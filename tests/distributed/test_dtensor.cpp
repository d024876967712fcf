// DeviceMesh, placements, and DTensor redistribute for every pair of placements
// (values and gradients) against local references.
#include "dist_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/distributed/dtensor.h"
#include "tp/distributed/redistribute.h"

namespace tp::dist {
namespace {

using testing::expect_close;
using PL = std::vector<Placement>;

// ---- references

// This rank's piece of `full` for shard/replicate placements, mesh dims in order.
Tensor nested_piece(const Tensor& full, const PL& ps, const DeviceMesh& mesh) {
  Tensor t = full;
  for (int64_t m = 0; m < mesh.ndim(); ++m)
    if (shard_dim(ps[m], full.dim())) t = local_piece(t, ps[m], mesh.size(m), mesh.coordinate(m));
  return t.clone();
}

// A valid local tensor for `ps` whose logical value is `full`: Partial dims get
// rank-dependent pieces (not just "value on coordinate 0") so reductions matter.
Tensor make_local(const Tensor& full, const PL& ps, const DeviceMesh& mesh) {
  Tensor t = nested_piece(full, ps, mesh);
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    auto* p = std::get_if<Partial>(&ps[m]);
    if (!p) continue;
    int64_t s = mesh.size(m);
    bool first = mesh.coordinate(m) == 0;
    std::vector<float> v = t.to_vector(), noise = Tensor::randn(t.shape(), 99 + m).to_vector();
    for (size_t i = 0; i < v.size(); ++i) {
      if (p->op == ReduceOp::Max)
        v[i] = first ? v[i] : v[i] - 1.f - std::abs(noise[i]);
      else if (p->op == ReduceOp::Sum)
        v[i] = first ? v[i] - (s - 1) * noise[i] : noise[i];
      else  // avg: pieces sum to s * value
        v[i] = first ? s * v[i] - (s - 1) * noise[i] : noise[i];
    }
    t = Tensor::from_vector(v, t.shape());
  }
  return t;
}

// The local gradient for a tensor with placements `ps` when the logical gradient is G.
Tensor grad_repr(const Tensor& g, const PL& ps, const DeviceMesh& mesh) {
  Tensor t = nested_piece(g, ps, mesh);
  std::vector<float> v = t.to_vector();
  for (int64_t m = 0; m < mesh.ndim(); ++m)
    if (auto* p = std::get_if<Partial>(&ps[m]); p && p->op == ReduceOp::Avg)
      for (float& x : v) x /= static_cast<float>(mesh.size(m));
  return Tensor::from_vector(v, t.shape());
}

bool has(const PL& ps, bool (*pred)(const Placement&)) {
  for (const Placement& p : ps)
    if (pred(p)) return true;
  return false;
}
bool is_max(const Placement& p) {
  auto* q = std::get_if<Partial>(&p);
  return q && q->op == ReduceOp::Max;
}
bool fits(const PL& ps, const Shape& shape) {
  for (const Placement& p : ps)
    if (auto* s = std::get_if<StridedShard>(&p); s && shape[normalize_dim(s->dim, shape.size())] % s->split_factor)
      return false;
  return true;
}

// Forward values and backward gradients of redistribute(src -> tgt).
void check_pair(const Tensor& full, const PL& src, const PL& tgt, const DeviceMesh& mesh) {
  std::string what = fmt::format("{} {} -> {} on {}", shape_str(full.shape()), to_string(src), to_string(tgt),
                                 mesh.to_string());
  DTensor x = DTensor::from_local(make_local(full, src, mesh), mesh, src, full.shape());
  DTensor y = x.redistribute(tgt);
  EXPECT_EQ(shape_str(y.local().shape()), shape_str(local_shape(full.shape(), tgt, mesh))) << what;
  if (!has(tgt, is_partial)) expect_close(y.local(), nested_piece(full, tgt, mesh), 1e-5, what + " local");
  expect_close(y.full_tensor(), full, 1e-5, what + " full_tensor");
  if (has(src, is_max) || has(tgt, is_max)) return;
  // Gradient: seed y with the logical gradient G in y's gradient layout; x must
  // receive G in its own layout (the adjoint collective).
  Tensor g = Tensor::randn(full.shape(), 4242);
  Tensor xl = make_local(full, src, mesh).set_requires_grad(true);
  DTensor xg = DTensor::from_local(xl, mesh, src, full.shape());
  DTensor yg = xg.redistribute(tgt);
  autograd::backward(yg.local(), grad_repr(g, tgt, mesh));
  ASSERT_TRUE(xl.grad().defined()) << what;
  expect_close(xl.grad(), grad_repr(g, src, mesh), 1e-5, what + " grad");
}

const PL kOneD[] = {{Shard{0}},   {Shard{1}},      {Shard{-1}}, {StridedShard{0, 2}}, {Replicate{}},
                    {Partial{}}, {Partial{ReduceOp::Avg}}, {Partial{ReduceOp::Max}}};

// ---- mesh and placements

TEST(DeviceMesh, SizesMustMultiplyToWorldSize) {
  try {
    DeviceMesh({world_size() + 1}, {"tp"});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiply to"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DeviceMesh::tp_mesh(world_size() + 1), Error);
}

TEST(DeviceMesh, RowMajorCoordinatesAndSubMeshGroups) {
  int w = world_size(), r = world_rank();
  int64_t a = w % 2 == 0 ? 2 : 1, b = w / a;
  DeviceMesh mesh({a, b}, {"dp", "tp"});
  EXPECT_EQ(mesh.coordinate(0), r / b);
  EXPECT_EQ(mesh.coordinate(1), r % b);
  DeviceMesh tp = mesh["tp"];
  EXPECT_EQ(tp.ndim(), 1);
  EXPECT_EQ(tp.size(), b);
  EXPECT_EQ(tp.group().rank(), r % b);
  // The tp group holds the ranks of this row: their sum is known in closed form.
  Tensor t = Tensor::from_ints({r}, {1}, DType::I64);
  tp.group().all_reduce(t);
  int64_t row = r / b, want = 0;
  for (int64_t c = 0; c < b; ++c) want += row * b + c;
  EXPECT_EQ(static_cast<int64_t>(t.item()), want);
  Tensor u = Tensor::from_ints({r}, {1}, DType::I64);
  mesh["dp"].group().all_reduce(u);
  int64_t want_dp = 0;
  for (int64_t q = 0; q < a; ++q) want_dp += q * b + r % b;
  EXPECT_EQ(static_cast<int64_t>(u.item()), want_dp);
  try {
    (void)mesh["pp"];
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid names: [dp, tp]"), std::string::npos) << e.what();
  }
}

TEST(Placement, PrintingEqualityAndSpans) {
  EXPECT_EQ(to_string(Placement{Shard{0}}), "S(0)");
  EXPECT_EQ(to_string(Placement{StridedShard{0, 2}}), "SS(0,2)");
  EXPECT_EQ(to_string(Placement{Replicate{}}), "R");
  EXPECT_EQ(to_string(Placement{Partial{}}), "P(sum)");
  EXPECT_EQ(to_string(PL{Shard{1}, Partial{ReduceOp::Max}}), "[S(1), P(max)]");
  EXPECT_EQ(Placement{Shard{0}}, Placement{Shard{0}});
  EXPECT_FALSE((Placement{Shard{0}} == Placement{StridedShard{0, 1}}));
  EXPECT_EQ(normalize(Shard{-1}, 3), Placement{Shard{2}});
  EXPECT_THROW(normalize(Shard{3}, 3), Error);
  // 10 rows over 4: 3, 3, 3, 1; 3 rows over 4: 1, 1, 1, 0.
  EXPECT_EQ(local_spans(Shard{0}, 10, 4, 3)[0].size, 1);
  EXPECT_EQ(local_spans(Shard{0}, 3, 4, 3)[0].size, 0);
  // SS(0,2) of 12 over 2: groups [0,6) [6,12); rank 1 holds [3,6) and [9,12).
  auto spans = local_spans(StridedShard{0, 2}, 12, 2, 1);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].offset, 3);
  EXPECT_EQ(spans[1].offset, 9);
  EXPECT_EQ(spans[1].size, 3);
  EXPECT_THROW(local_spans(StridedShard{0, 4}, 10, 2, 0), Error);
}

TEST(Redistribute, PlansAreOneCollectivePerChangedMeshDim) {
  auto plan = [](PL src, PL tgt, std::vector<int64_t> sizes) {
    return plan_redistribute({10, 6}, src, tgt, sizes, std::vector<int>(sizes.size(), 0));
  };
  EXPECT_EQ(plan({Shard{0}}, {Replicate{}}, {4}).size(), 1u);
  EXPECT_EQ(plan({Partial{}}, {Shard{1}}, {4}).size(), 1u);
  EXPECT_EQ(plan({Shard{0}}, {Shard{-1}}, {4}).size(), 1u);
  EXPECT_EQ(plan({Shard{1}}, {Shard{-1}}, {4}).size(), 0u);
  EXPECT_EQ(plan({StridedShard{0, 2}}, {Shard{0}}, {4}).size(), 2u);
  EXPECT_EQ(plan({Partial{}}, {Partial{ReduceOp::Avg}}, {4}).size(), 2u);
  // Nested shards of dim 0 go through Replicate.
  auto nested = plan({Shard{0}, Shard{0}}, {Replicate{}, Shard{0}}, {2, 2});
  EXPECT_EQ(to_string(nested),
            "mesh dim 1: S(0) -> R on [5, 6]\nmesh dim 0: S(0) -> R on [10, 6]\nmesh dim 1: R -> S(0) on [10, 6]\n");
  EXPECT_EQ(plan({Shard{0}, Partial{}}, {Replicate{}, Shard{1}}, {2, 2}).size(), 2u);
}

// ---- 1-D mesh: every pair, uneven sizes, values and gradients

TEST(Redistribute, EveryPairOnOneDimMesh) {
  DeviceMesh mesh = DeviceMesh::tp_mesh(world_size());
  for (Shape shape : {Shape{10, 6}, Shape{3, 5}, Shape{8, 4}}) {
    Tensor full = Tensor::randn(shape, 7);
    for (const PL& src : kOneD)
      for (const PL& tgt : kOneD)
        if (fits(src, shape) && fits(tgt, shape)) check_pair(full, src, tgt, mesh);
  }
}

TEST(Redistribute, FullTensorGradientIsTheLogicalGradient) {
  DeviceMesh mesh = DeviceMesh::tp_mesh(world_size());
  Tensor full = Tensor::randn({10, 3}, 8), g = Tensor::randn({10, 3}, 9);
  for (const PL& src : kOneD) {
    if (has(src, is_max)) continue;
    Tensor xl = make_local(full, src, mesh).set_requires_grad(true);
    Tensor whole = DTensor::from_local(xl, mesh, src, full.shape()).full_tensor();
    expect_close(whole, full, 1e-5, to_string(src) + " full_tensor");
    if (whole.is_same(xl)) continue;  // already replicated: nothing recorded
    autograd::backward(whole, g);
    expect_close(xl.grad(), grad_repr(g, src, mesh), 1e-5, to_string(src) + " grad");
  }
}

TEST(Redistribute, MaxPartialIsNotDifferentiable) {
  DeviceMesh mesh = DeviceMesh::tp_mesh(world_size());
  Tensor xl = Tensor::zeros({4, 2}).set_requires_grad(true);
  DTensor x = DTensor::from_local(xl, mesh, {Partial{ReduceOp::Max}}, Shape{4, 2});
  if (world_size() > 1) {
    EXPECT_THROW(x.redistribute({Replicate{}}), Error);
  }
}

TEST(DTensor, Bf16AndIntegerTensorsRedistribute) {
  DeviceMesh mesh = DeviceMesh::tp_mesh(world_size());
  for (DType d : {DType::BF16, DType::I64}) {
    Tensor full = testing::rank_input({10, 6}, 0, d);
    DTensor x = DTensor::distribute_tensor(full, mesh, {Shard{0}});
    EXPECT_EQ(x.local().dtype(), d);
    expect_close(x.redistribute({Shard{1}}).full_tensor(), full, 0, dtype_name(d));
    DTensor p = DTensor::from_local(full.clone(), mesh, {Partial{}}, full.shape());
    Tensor want = Tensor::empty(full.shape(), d);
    std::vector<float> v = full.to_vector();
    for (float& e : v) e *= static_cast<float>(world_size());
    want.copy_from(Tensor::from_vector(v, full.shape()));
    expect_close(p.redistribute({Shard{0}}).full_tensor(), want, 0, std::string("P->S ") + dtype_name(d));
  }
}

TEST(DTensor, FromLocalInfersUnevenGlobalShapeAndChecksIt) {
  DeviceMesh mesh = DeviceMesh::tp_mesh(world_size());
  ChunkSpan span = chunk_span(10, world_size(), world_rank());
  DTensor x = DTensor::from_local(Tensor::zeros({span.size, 4}), mesh, {Shard{0}});
  EXPECT_EQ(shape_str(x.shape()), "[10, 4]");
  EXPECT_THROW(DTensor::from_local(Tensor::zeros({span.size + 1, 4}), mesh, {Shard{0}}, Shape{10, 4}), Error);
  EXPECT_THROW(DTensor::from_local(Tensor::zeros({2, 4}), mesh, {Shard{2}}, Shape{10, 4}), Error);
  EXPECT_THROW(DTensor::from_local(Tensor::zeros({2, 4}), mesh, {Shard{0}, Replicate{}}), Error);
}

// ---- 2-D mesh (dp x tp)

TEST(Redistribute, EveryPairOnTwoDimMesh) {
  int w = world_size();
  int64_t a = w % 2 == 0 ? 2 : 1;
  DeviceMesh mesh({a, w / a}, {"dp", "tp"});
  const PL kTwoD[] = {{Shard{0}, Shard{1}},   {Shard{1}, Shard{0}}, {Replicate{}, Shard{0}},
                      {Shard{0}, Replicate{}}, {Shard{0}, Shard{0}}, {Shard{1}, Shard{1}},
                      {Partial{}, Shard{1}},   {Shard{0}, Partial{}}, {Replicate{}, Replicate{}},
                      {Partial{}, Partial{}},  {StridedShard{0, 2}, Shard{1}}, {Replicate{}, StridedShard{0, 2}},
                      {Shard{1}, StridedShard{0, 2}}};
  Tensor full = Tensor::randn({10, 7}, 11);
  for (const PL& src : kTwoD)
    for (const PL& tgt : kTwoD) check_pair(full, src, tgt, mesh);
}

}  // namespace
}  // namespace tp::dist
