// The walk of the cost analysis over an HLO module: each computation's cost is the sum of its
// instructions' costs, memoized per computation. The walk and the per-opcode formulas are in
// cost_analyzer.cc; the bytes at fusion boundaries and the convert overhead in fusion_cost.cc.
// Internal to the analysis (analysis.h is its interface).
#ifndef FLEXNPU_XLA_PASSES_COST_ANALYZER_H_
#define FLEXNPU_XLA_PASSES_COST_ANALYZER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xla_passes/analysis.h"
#include "xla_passes/cost.h"
#include "xla_passes/hlo_module.h"

namespace flexnpu::xla_passes::detail {

class Analyzer {
 public:
  Analyzer(const HloModule& m, const AnalysisOptions& o)
      : m_(m),
        o_(o),
        state_(m.computations.size(), 0),
        memo_(m.computations.size()),
        param_state_(m.computations.size(), 0),
        param_bytes_(m.computations.size()),
        fused_state_(m.computations.size(), 0),
        fused_memo_(m.computations.size()),
        utilization_(m.computations.size()) {}

  bool ComputationCost(int32_t ci, int depth, Cost* out, bool fused = false);
  const std::string& error() const { return error_; }
  // Per-instruction costs of the entry computation (after ComputationCost succeeded).
  std::vector<KernelInfo> EntryKernels(int32_t entry);

 private:
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  const Shape& OperandShape(const Computation& c, const Instruction& in, size_t i) const {
    return c.instructions[in.operands[i]].shape;
  }
  bool NeedOperands(const Instruction& in, size_t n) {
    if (in.operands.size() >= n) return true;
    return Fail("instruction '" + in.name + "' (" + in.opcode_name + ") has " +
                std::to_string(in.operands.size()) + " operands, needs " + std::to_string(n));
  }
  bool NeedCalled(const Instruction& in, size_t n) {
    if (in.called.size() >= n) return true;
    return Fail("instruction '" + in.name + "' (" + in.opcode_name + ") calls " +
                std::to_string(in.called.size()) + " computations, needs " + std::to_string(n));
  }
  bool DimOk(const Shape& s, int64_t d, const Instruction& in) {
    if (d >= 0 && d < static_cast<int64_t>(s.dims.size())) return true;
    return Fail("instruction '" + in.name + "' names dimension " + std::to_string(d) +
                " of a rank-" + std::to_string(s.dims.size()) + " shape");
  }

  // Per-opcode costs (cost_analyzer.cc).
  bool InstructionCost(const Computation& c, int32_t idx, int depth, Cost* cost);
  bool DotCost(const Computation& c, const Instruction& in, Cost* cost);
  bool ConvolutionFlops(const Computation& c, const Instruction& in, double* flops);
  bool GatherScatterBytes(const Computation& c, const Instruction& in, int depth, Cost* cost);
  void NoteStateAppend(const Shape& buffer, const Shape& update, Cost* cost) const;

  // Fusion boundaries and convert overhead (fusion_cost.cc).
  bool FusionCost(const Computation& c, const Instruction& in, int depth, Cost* cost);
  void AddConvertOverhead(const Computation& c, int32_t idx, Cost* own) const;
  bool IsPureConvertFusion(const Instruction& in) const;
  // The parameter a fusion rooted at a scatter updates in place (-1: none, or xla_compatible).
  int64_t InPlaceScatterState(const Instruction& in) const;
  // HloCostAnalysis::FusionParameterReadBytes for instruction `idx` of fused computation `ci`.
  bool ReadBytes(int32_t ci, int32_t idx, int depth, double* out);
  bool ParamReadBytes(int32_t ci, int64_t param, int depth, double* out);

  // Fraction of each fused instruction's output that the fusion needs (root: 1; a slice,
  // dynamic-slice or gather needs only its output's share of operand 0). Only an executed
  // fraction of an elementwise op inside a fusion runs: a convert of a whole embedding table
  // fused into the gather that reads 8 rows converts 8 rows.
  const std::vector<double>& Utilization(int32_t ci);

  const HloModule& m_;
  const AnalysisOptions& o_;
  std::string error_;
  std::vector<int8_t> state_;  // 0 new, 1 in progress, 2 done
  std::vector<Cost> memo_;
  std::vector<int8_t> param_state_;
  std::vector<std::vector<double>> param_bytes_;
  std::vector<int8_t> fused_state_;
  std::vector<Cost> fused_memo_;
  std::vector<std::vector<double>> utilization_;
};

}  // namespace flexnpu::xla_passes::detail

#endif  // FLEXNPU_XLA_PASSES_COST_ANALYZER_H_
