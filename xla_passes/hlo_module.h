// A read-only view of an optimized HLO module, parsed from protobuf bytes without linking
// protobuf. Only the fields the cost analysis needs are kept; everything else is skipped.
//
// Field numbers follow openxla/xla `xla/service/hlo.proto` and `xla/xla_data.proto`.
// Parsing never trusts the input: every length is checked by the wire reader, every id is
// resolved through a checked lookup, nesting is bounded, and the result is validated
// (operands inside their computation, called computations inside the module) before the
// analysis sees it.
#ifndef FLEXNPU_XLA_PASSES_HLO_MODULE_H_
#define FLEXNPU_XLA_PASSES_HLO_MODULE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::xla_passes {

// xla.PrimitiveType values used by the analysis.
enum PrimitiveType : int32_t {
  kInvalidType = 0,
  kPred = 1,
  kTuple = 13,
  kOpaque = 14,
  kToken = 17,
};

// Bytes per element of an xla.PrimitiveType (sub-byte types count one byte unless the layout
// sets element_size_in_bits); 0 for non-array types and unknown values.
int PrimitiveTypeBytes(int32_t type);
const char* PrimitiveTypeName(int32_t type);

struct Shape {
  int32_t element_type = kInvalidType;
  std::vector<int64_t> dims;
  std::vector<Shape> tuple_shapes;
  bool has_layout = false;
  std::vector<int64_t> minor_to_major;
  int64_t element_size_in_bits = 0;
  bool dynamic = false;

  bool IsTuple() const { return element_type == kTuple; }
  bool IsArray() const { return PrimitiveTypeBytes(element_type) > 0; }
  // Number of elements of an array shape (as a double: adversarial dims cannot overflow).
  double Elements() const;
  // e.g. "f32[8,128]" or "(f32[8], s32[])".
  std::string ToString() const;
};

enum class Opcode : uint8_t {
  kOther = 0,
  // No data movement, no compute.
  kParameter, kConstant, kGetTupleElement, kBitcast, kDomain, kAfterAll, kAddDependency,
  kTuple,
  // Data movement.
  kSlice, kDynamicSlice, kDynamicUpdateSlice, kTranspose, kCopy, kBroadcast, kReshape,
  kConcatenate, kPad, kReverse, kIota, kGather, kScatter,
  // Compute.
  kElementwise, kTranscendental, kDot, kConvolution, kFft, kReduce, kReduceWindow, kMap,
  kSelectAndScatter, kSort, kRng, kRngBitGenerator, kAllReduce, kTriangularSolve, kCholesky,
  // Control flow and calls.
  kFusion, kCall, kWhile, kConditional, kCustomCall, kAsyncStart,
};

Opcode ClassifyOpcode(std::string_view name);

struct DotDimensions {
  std::vector<int64_t> lhs_contracting, rhs_contracting, lhs_batch, rhs_batch;
};

struct ConvDimensions {
  int64_t input_batch = 0, input_feature = 0, output_feature = 0;
  std::vector<int64_t> input_spatial, kernel_spatial, output_spatial;
};

struct WindowDim {
  int64_t size = 0, stride = 1, padding_low = 0, padding_high = 0;
  int64_t window_dilation = 1, base_dilation = 1;
};

struct Instruction {
  std::string name;
  std::string opcode_name;
  Opcode opcode = Opcode::kOther;
  Shape shape;
  int64_t id = 0;
  int64_t parameter_number = 0;
  int64_t tuple_index = 0;
  std::vector<int64_t> operand_ids;
  std::vector<int64_t> called_computation_ids;
  std::vector<int64_t> dimensions;
  std::vector<int64_t> fft_length;
  DotDimensions dot;
  ConvDimensions conv;
  std::vector<WindowDim> window;
  int64_t feature_group_count = 1;
  int64_t batch_group_count = 1;
  std::string fusion_kind;
  std::string custom_call_target;
  std::string backend_config;

  // Resolved by ParseHloModule: indices into the computation's instructions and the
  // module's computations. Always in range.
  std::vector<int32_t> operands;
  std::vector<int32_t> called;
};

struct Computation {
  std::string name;
  int64_t id = 0;
  int64_t root_id = -1;
  bool is_fusion = false;
  std::vector<Instruction> instructions;
  int32_t root = -1;                            // index of the root instruction
  std::vector<std::vector<int32_t>> users;      // unique users of each instruction
  std::vector<int32_t> parameters;              // parameter_number -> instruction index
};

struct AliasEntry {
  std::vector<int64_t> output_index;
  int64_t parameter_number = 0;
  std::vector<int64_t> parameter_index;
  int64_t kind = 0;  // 1 = may alias, 2 = must alias
};

struct DonorEntry {
  int64_t parameter_number = 0;
  std::vector<int64_t> parameter_index;
};

struct HloModule {
  std::string name;
  std::vector<Computation> computations;
  int32_t entry = -1;
  std::vector<AliasEntry> aliases;
  std::vector<DonorEntry> donors;
  bool had_config_wrapper = false;  // input was an HloModuleProtoWithConfig
};

struct ParseLimits {
  int max_shape_depth = 32;          // nested tuple shapes
  size_t max_rank = 64;              // dimensions of one array
  size_t max_instructions = 4u << 20;  // per module
};

// Parses an HloModuleProto, or an HloModuleProtoWithConfig / HloProto whose field 1 is the
// module (the format `PJRT_Executable_OptimizedProgram` returns as "hlo_with_config").
StatusOr<HloModule> ParseHloModule(std::string_view bytes, const ParseLimits& limits = {});

// Reads the known trip count of a while loop from its backend_config JSON
// ({"known_trip_count":{"n":"8"},...}); -1 if absent or malformed.
int64_t KnownTripCount(std::string_view backend_config);

}  // namespace flexnpu::xla_passes

#endif  // FLEXNPU_XLA_PASSES_HLO_MODULE_H_
