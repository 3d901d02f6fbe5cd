// Unit tests of the HLO analysis on hand-built HloModuleProto bytes and on modules that jax
// produced (xla_passes/tests/data/*.pb, written by xla_passes/fuzz/make_seeds.py).
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pjrt_flexnpu/base/wire.h"
#include "xla_passes/analysis.h"
#include "xla_passes/roofline.h"

namespace flexnpu::xla_passes {
namespace {

using proto::Writer;

constexpr int kF32 = 11;
constexpr int kBF16 = 16;
constexpr int kS32 = 4;

std::string ShapeProto(int type, const std::vector<int64_t>& dims, bool layout = true) {
  Writer w;
  w.Varint(2, type);
  w.PackedVarints(3, dims);
  if (layout) {
    Writer l;
    std::vector<int64_t> m2m;
    for (int64_t i = static_cast<int64_t>(dims.size()) - 1; i >= 0; --i) m2m.push_back(i);
    l.PackedVarints(1, m2m);
    w.Bytes(5, l.str());
  }
  return w.Take();
}

std::string TupleShape(const std::vector<std::string>& elements) {
  Writer w;
  w.Varint(2, 13);
  for (const auto& e : elements) w.Bytes(4, e);
  return w.Take();
}

struct Instr {
  int64_t id;
  std::string opcode;
  std::string shape;
  std::vector<int64_t> operands;
  std::vector<int64_t> called;
  int64_t parameter_number = -1;
  std::string extra;  // pre-encoded extra fields
};

std::string InstrProto(const Instr& in) {
  Writer w;
  w.Bytes(1, in.opcode + "." + std::to_string(in.id));
  w.Bytes(2, in.opcode);
  w.Bytes(3, in.shape);
  if (in.parameter_number >= 0) w.Varint(9, in.parameter_number);
  w.Varint(35, in.id);
  if (!in.operands.empty()) w.PackedVarints(36, in.operands);
  if (!in.called.empty()) w.PackedVarints(38, in.called);
  w.Raw(in.extra);
  return w.Take();
}

std::string ComputationProto(int64_t id, const std::string& name, const std::vector<Instr>& ins,
                             int64_t root_id, bool fusion = false) {
  Writer w;
  w.Bytes(1, name);
  for (const auto& in : ins) w.Bytes(2, InstrProto(in));
  w.Varint(5, id);
  w.Varint(6, root_id);
  if (fusion) w.Varint(7, 1);
  return w.Take();
}

std::string ModuleProto(const std::vector<std::string>& computations, int64_t entry_id) {
  Writer w;
  w.Bytes(1, "test_module");
  for (const auto& c : computations) w.Bytes(3, c);
  w.Varint(6, entry_id);
  return w.Take();
}

std::string DotDims(std::vector<int64_t> lc, std::vector<int64_t> rc, std::vector<int64_t> lb = {},
                    std::vector<int64_t> rb = {}) {
  Writer d;
  d.PackedVarints(1, lc);
  d.PackedVarints(2, rc);
  if (!lb.empty()) d.PackedVarints(3, lb);
  if (!rb.empty()) d.PackedVarints(4, rb);
  Writer w;
  w.Bytes(30, d.str());
  return w.Take();
}

// ENTRY: p0 = f32[M,K], p1 = f32[K,N], dot = f32[M,N].
std::string MatmulModule(int64_t m, int64_t k, int64_t n, int type = kF32) {
  std::vector<Instr> ins = {
      {1, "parameter", ShapeProto(type, {m, k}), {}, {}, 0},
      {2, "parameter", ShapeProto(type, {k, n}), {}, {}, 1},
      {3, "dot", ShapeProto(type, {m, n}), {1, 2}, {}, -1, DotDims({1}, {0})},
  };
  return ModuleProto({ComputationProto(7, "main", ins, 3)}, 7);
}

TEST(Analysis, MatmulFlopsAndBytes) {
  auto p = AnalyzeHloProto(MatmulModule(512, 4096, 4096));
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_DOUBLE_EQ(p->flops, 2.0 * 512 * 4096 * 4096);
  EXPECT_DOUBLE_EQ(p->bytes_accessed, 4.0 * (512 * 4096 + 4096 * 4096 + 512 * 4096));
  EXPECT_DOUBLE_EQ(p->bytes_written, 4.0 * 512 * 4096);
  EXPECT_EQ(p->dot_count, 1);
  EXPECT_EQ(p->gemv_dot_count, 0);
  EXPECT_EQ(p->largest_parameters.size(), 2u);
  EXPECT_EQ(p->largest_parameters[0].index, 1);
  EXPECT_EQ(p->largest_parameters[0].shape, "f32[4096,4096]");
}

TEST(Analysis, GemvIsFlaggedAndBandwidthBound) {
  auto p = AnalyzeHloProto(MatmulModule(1, 8192, 8192));  // 268 MB: 56 us on an H200
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->gemv_dot_count, 1);
  EXPECT_NEAR(p->arithmetic_intensity, 0.5, 0.01);
  auto h200 = FindDevice("H200");
  ASSERT_TRUE(h200.ok());
  auto c = Classify(p.value(), h200.value());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->phase, Phase::kDecode);
  auto big = AnalyzeHloProto(MatmulModule(4096, 8192, 8192));
  ASSERT_TRUE(big.ok());
  auto cb = Classify(big.value(), h200.value());
  ASSERT_TRUE(cb.ok());
  EXPECT_EQ(cb->phase, Phase::kPrefill);
  auto tiny = AnalyzeHloProto(MatmulModule(4, 16, 16));
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(Classify(tiny.value(), h200.value())->phase, Phase::kSmall);
}

TEST(Analysis, BatchedDotUsesContractingDimsOnly) {
  std::vector<Instr> ins = {
      {1, "parameter", ShapeProto(kF32, {8, 64, 32}), {}, {}, 0},
      {2, "parameter", ShapeProto(kF32, {8, 32, 16}), {}, {}, 1},
      {3, "dot", ShapeProto(kF32, {8, 64, 16}), {1, 2}, {}, -1, DotDims({2}, {1}, {0}, {0})},
  };
  auto p = AnalyzeHloProto(ModuleProto({ComputationProto(1, "main", ins, 3)}, 1));
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_DOUBLE_EQ(p->flops, 2.0 * 8 * 64 * 16 * 32);
}

TEST(Analysis, FusionCountsBoundaryBytesAndInnerFlops) {
  // fused: p0 f32[1024], p1 f32[1024] -> exp(p0) + p1 ; entry calls it.
  std::vector<Instr> fused = {
      {1, "parameter", ShapeProto(kF32, {1024}), {}, {}, 0},
      {2, "parameter", ShapeProto(kF32, {1024}), {}, {}, 1},
      {3, "exponential", ShapeProto(kF32, {1024}), {1}},
      {4, "add", ShapeProto(kF32, {1024}), {3, 2}},
  };
  std::vector<Instr> entry = {
      {1, "parameter", ShapeProto(kF32, {1024}), {}, {}, 0},
      {2, "parameter", ShapeProto(kF32, {1024}), {}, {}, 1},
      {3, "fusion", ShapeProto(kF32, {1024}), {1, 2}, {5}},
  };
  auto p = AnalyzeHloProto(ModuleProto(
      {ComputationProto(5, "fused", fused, 4, true), ComputationProto(6, "main", entry, 3)}, 6));
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_DOUBLE_EQ(p->flops, 1024);
  EXPECT_DOUBLE_EQ(p->transcendentals, 1024);
  EXPECT_DOUBLE_EQ(p->bytes_accessed, 3 * 4096);
  EXPECT_EQ(p->fusion_count, 1);
}

TEST(Analysis, DynamicUpdateSliceIntoLargeStateIsAnAppend) {
  std::vector<Instr> entry = {
      {1, "parameter", ShapeProto(kBF16, {32, 4096, 128}), {}, {}, 0},
      {2, "parameter", ShapeProto(kBF16, {32, 1, 128}), {}, {}, 1},
      {3, "parameter", ShapeProto(kS32, {}), {}, {}, 2},
      {4, "dynamic-update-slice", ShapeProto(kBF16, {32, 4096, 128}), {1, 2, 3, 3, 3}},
  };
  auto p = AnalyzeHloProto(ModuleProto({ComputationProto(1, "main", entry, 4)}, 1));
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->state_append_count, 1);
  EXPECT_DOUBLE_EQ(p->state_append_buffer_bytes, 2.0 * 32 * 4096 * 128);
  // In place: the update is read and written, plus one index.
  EXPECT_DOUBLE_EQ(p->bytes_accessed, 2 * 2.0 * 32 * 128 + 4);
}

std::string WhileModule(const std::string& backend_config) {
  std::vector<Instr> body = {
      {1, "parameter", ShapeProto(kF32, {256}), {}, {}, 0},
      {2, "sine", ShapeProto(kF32, {256}), {1}},
  };
  std::vector<Instr> cond = {
      {1, "parameter", ShapeProto(kF32, {256}), {}, {}, 0},
      {2, "constant", ShapeProto(1, {}), {}},
  };
  Writer cfg;
  cfg.Bytes(43, backend_config);
  std::vector<Instr> entry = {
      {1, "parameter", ShapeProto(kF32, {256}), {}, {}, 0},
      {2, "while", ShapeProto(kF32, {256}), {1}, {10, 11}, -1, cfg.str()},
  };
  return ModuleProto({ComputationProto(10, "body", body, 2), ComputationProto(11, "cond", cond, 2),
                      ComputationProto(12, "main", entry, 2)},
                     12);
}

TEST(Analysis, WhileUsesKnownTripCount) {
  const std::string m = WhileModule(R"({"known_trip_count":{"n":"8"},"known_init_step":{}})");
  auto p = AnalyzeHloProto(m);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_DOUBLE_EQ(p->transcendentals, 8 * 256);
  EXPECT_EQ(p->max_trip_count, 8);
  AnalysisOptions once;
  once.xla_compatible = true;
  auto q = AnalyzeHloProto(m, once);
  ASSERT_TRUE(q.ok());
  EXPECT_DOUBLE_EQ(q->transcendentals, 256);
  auto unknown = AnalyzeHloProto(WhileModule("{}"));
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->while_loops_unknown_trip_count, 1);
  EXPECT_DOUBLE_EQ(unknown->transcendentals, 256);
}

TEST(Analysis, KnownTripCountParsing) {
  EXPECT_EQ(KnownTripCount(R"({"known_trip_count":{"n":"28"}})"), 28);
  EXPECT_EQ(KnownTripCount(R"({"known_trip_count": {"n": 5}})"), 5);
  EXPECT_EQ(KnownTripCount(R"({"known_trip_count":{}})"), -1);
  EXPECT_EQ(KnownTripCount(""), -1);
  EXPECT_EQ(KnownTripCount(R"("known_trip_count")"), -1);
}

TEST(Analysis, AcceptsModuleWithConfigWrapper) {
  const std::string module = MatmulModule(8, 8, 8);
  Writer w;
  w.Bytes(1, module);
  w.Bytes(2, std::string("\x08\x01", 2));  // a config with some field
  auto p = AnalyzeHloProto(w.str());
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_TRUE(p->from_config_wrapper);
  EXPECT_DOUBLE_EQ(p->flops, 2.0 * 8 * 8 * 8);
}

TEST(Analysis, RejectsBadReferences) {
  std::vector<Instr> bad_operand = {
      {1, "parameter", ShapeProto(kF32, {4}), {}, {}, 0},
      {2, "add", ShapeProto(kF32, {4}), {1, 99}},
  };
  auto a = AnalyzeHloProto(ModuleProto({ComputationProto(1, "main", bad_operand, 2)}, 1));
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("unknown operand id 99"), std::string::npos) << a.status().message();

  std::vector<Instr> bad_call = {
      {1, "parameter", ShapeProto(kF32, {4}), {}, {}, 0},
      {2, "fusion", ShapeProto(kF32, {4}), {1}, {42}},
  };
  EXPECT_FALSE(AnalyzeHloProto(ModuleProto({ComputationProto(1, "main", bad_call, 2)}, 1)).ok());

  // A computation that calls itself.
  std::vector<Instr> self = {
      {1, "parameter", ShapeProto(kF32, {4}), {}, {}, 0},
      {2, "call", ShapeProto(kF32, {4}), {1}, {1}},
  };
  auto s = AnalyzeHloProto(ModuleProto({ComputationProto(1, "main", self, 2)}, 1));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("calls itself"), std::string::npos) << s.status().message();

  // Dot naming a dimension that does not exist.
  std::vector<Instr> bad_dot = {
      {1, "parameter", ShapeProto(kF32, {4, 4}), {}, {}, 0},
      {2, "dot", ShapeProto(kF32, {4, 4}), {1, 1}, {}, -1, DotDims({7}, {0})},
  };
  EXPECT_FALSE(AnalyzeHloProto(ModuleProto({ComputationProto(1, "main", bad_dot, 2)}, 1)).ok());
  EXPECT_FALSE(AnalyzeHloProto("").ok());
  EXPECT_FALSE(AnalyzeHloProto(ModuleProto({}, 0)).ok());
  EXPECT_FALSE(AnalyzeHloProto(std::string("\xff\xff\xff", 3)).ok());
}

TEST(Analysis, EveryTruncationAndRandomCorruptionFailsCleanly) {
  const std::string m = WhileModule(R"({"known_trip_count":{"n":"3"}})");
  for (size_t n = 0; n < m.size(); ++n) {
    (void)AnalyzeHloProto(std::string_view(m).substr(0, n));  // must not crash
  }
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string c = m;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) c[rng() % c.size()] = static_cast<char>(rng());
    (void)AnalyzeHloProto(c);
  }
  for (int trial = 0; trial < 300; ++trial) {
    std::string random(rng() % 512, '\0');
    for (char& ch : random) ch = static_cast<char>(rng());
    (void)AnalyzeHloProto(random);
  }
}

TEST(Roofline, ModelledSecondsIsTheEfficiencyRooflinePlusLaunch) {
  DeviceSpec d{"d", 1e15, 1e12, 10e-6, true, "test"};
  d.eff_compute = 0.5;
  d.eff_memory = 0.8;
  // Compute-bound: 1e12 FLOPs at 0.5 PFLOP/s = 2 ms; 1e9 bytes at 0.8 TB/s = 1.25 ms.
  EXPECT_DOUBLE_EQ(ModelledSeconds(d, 1e12, 1e9), 2e-3 + 10e-6);
  // Bandwidth-bound: 8e9 bytes at 0.8 TB/s = 10 ms.
  EXPECT_DOUBLE_EQ(ModelledSeconds(d, 1e12, 8e9), 10e-3 + 10e-6);
  EXPECT_DOUBLE_EQ(ModelledSeconds(d, 0, 0), 10e-6);
  LinkSpec link{"l", 100e9, 2e-6, "test"};
  EXPECT_DOUBLE_EQ(TransferSeconds(link, 1e9), 10e-3 + 2e-6);
  EXPECT_FALSE(FindLink("carrier-pigeon").ok());
}

TEST(Roofline, PresetsAndCustomDevices) {
  for (const char* name : {"ascend910b", "ascend910c", "h100", "h200", "cpu", "Ascend-910C"}) {
    auto d = FindDevice(name);
    ASSERT_TRUE(d.ok()) << name;
    EXPECT_GT(d->ridge(), 1);
    EXPECT_FALSE(d->source.empty());
  }
  EXPECT_FALSE(FindDevice("tpu-v9").ok());
  // The emulated backend's preset names.
  for (const char* name : {"910b", "910c", "h100", "h200", "a100"}) {
    auto d = FindDevice(name);
    ASSERT_TRUE(d.ok()) << name;
    EXPECT_GT(d->memory_bytes, 0) << name;
    EXPECT_GT(d->eff_compute, 0) << name;
    EXPECT_LE(d->eff_compute, 1) << name;
    EXPECT_TRUE(FindLink(d->link).ok()) << name << " " << d->link;
  }
  ExecutableProfile p;
  p.flops = 1e12;
  p.bytes_accessed = 2e9;  // intensity 500
  DeviceSpec custom{"custom", 1e15, 1e12, 0, true, "test"};  // ridge 1000
  auto c = Classify(p, custom);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->phase, Phase::kDecode);
  EXPECT_DOUBLE_EQ(c->ridge, 1000);
  custom.peak_flops = 1e14;  // ridge 100 < intensity 500
  EXPECT_EQ(Classify(p, custom)->phase, Phase::kPrefill);
  custom.mem_bandwidth = 0;
  EXPECT_FALSE(Classify(p, custom).ok());
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Modules produced by jax (see make_seeds.py): they must parse, and the analysis must find
// the dot FLOPs recorded next to them by XLA's own cost analysis.
TEST(Analysis, RealModulesFromJax) {
  const std::string dir = FLEXNPU_TEST_DATA_DIR;
  const std::string text = ReadFile(dir + "/expected.txt");
  ASSERT_FALSE(text.empty()) << "missing " << dir << "/expected.txt";
  std::istringstream lines(text);
  std::string name;
  double flops = 0, bytes = 0;
  int checked = 0;
  while (lines >> name >> flops >> bytes) {
    const std::string data = ReadFile(dir + "/" + name);
    ASSERT_FALSE(data.empty()) << name;
    AnalysisOptions once;
    once.xla_compatible = true;  // XLA's convention
    auto p = AnalyzeHloProto(data, once);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status().message();
    EXPECT_NEAR(p->flops, flops, 0.01 * flops + 1) << name;
    EXPECT_NEAR(p->bytes_accessed, bytes, 0.10 * bytes + 1) << name;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace flexnpu::xla_passes
